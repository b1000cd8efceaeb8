"""Refund triage runner: test input as JSON on stdin; a transcript on stdout.

The transcript is `{"output": <reply>, "tool_calls": [{"name", "arguments"}]}`, which
skilleval reads for the tool_usage strategy. Tools are simulated from eval/fixtures/orders.json.
"""
import json
import os
import re
import sys


def decide(order):
    if order["final_sale"]:
        return False, "§3.4", "final-sale items cannot be refunded"
    if order["damaged"]:
        return True, "§2.3", "damaged items are refunded at any time"
    if order["days_since_delivery"] <= 30:
        return True, "§2.1", "the request is within 30 days of delivery"
    return False, "§2.1", "the 30-day refund window has passed"


def main():
    request = json.load(sys.stdin)
    with open(os.path.join("eval", "fixtures", "orders.json"), encoding="utf-8") as fh:
        orders = json.load(fh)
    match = re.search(r"\b([A-Z]-\d{4})\b", request.get("prompt", ""))
    calls = []
    if not match or match.group(1) not in orders:
        reply = "I'm sorry, I could not find that order. Could you share the order id (like A-1234)?"
        print(json.dumps({"output": reply, "tool_calls": calls}))
        return
    order_id = match.group(1)
    order = orders[order_id]
    calls.append({"name": "lookup_order", "arguments": {"order_id": order_id}})
    calls.append({"name": "check_policy", "arguments": {"category": order["category"], "days_since_delivery": order["days_since_delivery"]}})
    approved, section, reason = decide(order)
    if approved:
        calls.append({"name": "issue_refund", "arguments": {"order_id": order_id, "amount": order["amount"]}})
    version = os.environ.get("POLICY_VERSION", "unknown")
    decision = "APPROVED" if approved else "DECLINED"
    reply = (
        f"Thank you for contacting us about order {order_id}. Your refund is {decision}: {reason} "
        f"(refund policy {section}, version {version}). Please let us know if we can help with anything else."
    )
    print(json.dumps({"output": reply, "tool_calls": calls}, ensure_ascii=False))


if __name__ == "__main__":
    main()
