"""schemathesis hooks for scripts/schemathesis.sh: half of the generated path parameters are
replaced by objects that exist (the seeded skill, its completed run and its version), so the
operations reach their logic instead of answering 404 to every random id. Which half is decided
by the generated value itself, so a seed reproduces the same requests."""

import os

import schemathesis

SKILL = os.environ.get("ST_SKILL", "")
RUN = os.environ.get("ST_RUN", "")


@schemathesis.hook
def map_path_parameters(ctx, path_parameters):
    if not path_parameters:
        return path_parameters
    path = getattr(getattr(ctx, "operation", None), "path", "") or ""
    for key, value in list(path_parameters.items()):
        if len(str(value)) % 2:
            continue
        if key == "name" and SKILL:
            path_parameters[key] = SKILL
        elif key == "id" and RUN and path.startswith("/v1/runs/"):
            path_parameters[key] = RUN
    return path_parameters
