"""Custom grader: is the refund decision the one the policy requires?

Input (stdin): {"output", "prompt", "context", "expected", "tool_calls", "test_case_id"}.
Output (stdout): {"score", "passed", "details", "feedback"}.
"""
import json
import sys

request = json.load(sys.stdin)
output = request.get("output", "")
want = (request.get("context") or {}).get("expected_decision", "")
calls = [c.get("name") for c in request.get("tool_calls") or []]
said = "APPROVED" if "APPROVED" in output else "DECLINED" if "DECLINED" in output else None
refunded = "issue_refund" in calls

checks = {
    "decision stated": said is not None,
    "decision matches policy": said == want,
    "refund issued only when approved": refunded == (want == "APPROVED"),
}
score = sum(checks.values()) / len(checks)
print(json.dumps({
    "score": score,
    "passed": all(checks.values()),
    "details": {"checks": [{"check": k, "passed": v} for k, v in checks.items()], "decision": said},
    "feedback": None if all(checks.values()) else f"expected {want}, the reply says {said}",
}))
