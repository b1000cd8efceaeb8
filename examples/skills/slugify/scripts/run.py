"""Slugify runner: test input as JSON on stdin, the slug on stdout."""
import json
import re
import sys
import unicodedata


def slugify(title, limit=60):
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", folded.lower()).strip("-")
    if len(slug) > limit:
        slug = slug[:limit].rsplit("-", 1)[0]
    return slug


if __name__ == "__main__":
    request = json.load(sys.stdin)
    print(slugify(request.get("prompt", "")))
