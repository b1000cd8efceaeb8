"""Contact extractor runner: test input as JSON on stdin, a JSON object on stdout.

A rule-based extractor: one contact per line or sentence that carries a capitalised name,
with the email, phone and "street, city postcode" address found beside it.
"""
import json
import os
import re
import sys

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
PHONE = re.compile(r"\+?\d[\d ()-]{7,}\d")
NAME = re.compile(r"\b([A-Z][a-z]+(?: [A-Z][a-z]+)+)\b")
ADDRESS = re.compile(r"(\d+ [A-Z][\w ]+?(?:Street|St|Road|Rd|Avenue|Ave|Lane)),\s*([A-Z][a-z]+)\s+(\w{3,8})")
STOP = {"Calle Mayor", "Main Street", "High Street", "Extract Contacts"}


def extract(text):
    contacts = []
    for chunk in re.split(r"[\n;]|(?<=\.)\s", text):
        names = [n for n in NAME.findall(chunk) if n not in STOP and not n.endswith(("Street", "Road", "Avenue", "Lane"))]
        if not names:
            continue
        contact = {"name": names[0]}
        if (m := EMAIL.search(chunk)):
            contact["email"] = m.group(0)
        if (m := PHONE.search(chunk)):
            contact["phone"] = m.group(0).strip()
        if (m := ADDRESS.search(chunk)):
            contact["address"] = {"street": m.group(1), "city": m.group(2), "postcode": m.group(3)}
        contacts.append(contact)
    return {"contacts": contacts, "count": len(contacts)}


def main():
    request = json.load(sys.stdin)
    text = request.get("prompt", "")
    document = (request.get("context") or {}).get("document")
    if document:
        with open(os.path.join(os.getcwd(), document), encoding="utf-8") as fh:
            text += "\n" + fh.read()
    fenced = (request.get("context") or {}).get("fenced", False)
    body = json.dumps(extract(text), ensure_ascii=False)
    print(f"Here you go:\n```json\n{body}\n```" if fenced else body)


if __name__ == "__main__":
    main()
