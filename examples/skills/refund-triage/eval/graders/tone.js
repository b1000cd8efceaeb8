// Custom grader: is the reply polite, short, and does it cite a policy section?
// Input (stdin): {"output", "prompt", "context", "expected", "tool_calls", "test_case_id"}.
// Output (stdout): {"score", "passed", "details", "feedback"}.
const chunks = [];
process.stdin.on("data", (c) => chunks.push(c));
process.stdin.on("end", () => {
  const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const out = req.output || "";
  const sentences = out.split(/(?<=[.!?])\s+/).filter((s) => s.trim().length > 0);
  const checks = [
    { check: "polite opening", passed: /^(thank you|thanks|hello|hi)\b/i.test(out) },
    { check: "cites a policy section", passed: /§\d+\.\d+/.test(out) },
    { check: "two or three sentences", passed: sentences.length >= 2 && sentences.length <= 3 },
    { check: "no blame words", passed: !/\b(your fault|obviously|stupid)\b/i.test(out) },
  ];
  const passed = checks.filter((c) => c.passed).length;
  process.stdout.write(JSON.stringify({
    score: passed / checks.length,
    passed: passed === checks.length,
    details: { checks, sentences: sentences.length },
  }));
});
