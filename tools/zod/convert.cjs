// Converts one Zod schema's source (read from stdin) to JSON Schema (written to stdout).
//
// skilleval runs this under its sandbox (no network, read-only, a timeout) when a test case's
// `expected.zodSchema` is validated; see docs/strategies.md (json_schema). The source is a
// JavaScript expression in which `z` is Zod (lines importing `z` from "zod" are ignored, and a
// leading `export default` too). It is evaluated with Zod 4 first; when that throws, or gives
// something that is not a Zod 4 schema, with the Zod 3 API that the same pinned package ships
// (`zod/v3`), converted by zod-to-json-schema. Zod 4's result is draft 2020-12, Zod 3's draft 7.
//
// Answer, always exit 0 when the answer could be written:
//   {"ok": true, "zod": "4" | "3", "schema": {...}}
//   {"ok": false, "error": "<Node's message>"}
"use strict";

const vm = require("node:vm");

function readStdin() {
  const chunks = [];
  const fd = 0;
  const buf = Buffer.alloc(65536);
  const fs = require("node:fs");
  for (;;) {
    let n;
    try {
      n = fs.readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      if (e.code === "EAGAIN") continue;
      if (e.code === "EOF") break;
      throw e;
    }
    if (n === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  return Buffer.concat(chunks).toString("utf8");
}

// The source without the lines a copied module starts with.
function expressionOf(source) {
  const kept = source
    .split("\n")
    .filter((line) => !/^\s*import\s.*from\s*["']zod(\/v[34])?["']\s*;?\s*$/.test(line));
  let text = kept.join("\n").trim();
  text = text.replace(/^export\s+default\s+/, "");
  text = text.replace(/;\s*$/, "");
  return text;
}

function evaluate(expression, z) {
  // A fresh context holding only `z`: the source sees no `require`, `process` or globals of
  // this script. The timeout stops a source that loops before the sandbox's own does.
  return vm.runInNewContext("(" + expression + "\n)", { z }, { timeout: 2000 });
}

function describe(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "object" ? "an object that is not a Zod schema" : "a " + typeof value;
}

function message(e) {
  if (e && typeof e.message === "string") {
    return (e.name && e.name !== "Error" ? e.name + ": " : "") + e.message;
  }
  return String(e);
}

function convert(source) {
  const expression = expressionOf(source);
  if (expression === "") {
    return { ok: false, error: "the source is empty: write a Zod schema, e.g. z.object({ name: z.string() })" };
  }
  const z4 = require("zod");
  let v4Error;
  let schema;
  try {
    schema = evaluate(expression, z4);
  } catch (e) {
    v4Error = message(e);
  }
  if (v4Error === undefined) {
    if (schema && typeof schema === "object" && schema._zod) {
      // `input`: what the schema accepts (an object's unknown keys included), which is what
      // checking an output against it asks.
      const converted = z4.toJSONSchema(schema, { target: "draft-2020-12", io: "input", unrepresentable: "throw" });
      return { ok: true, zod: "4", schema: converted };
    }
    v4Error = "the source evaluates to " + describe(schema) + ", not a Zod schema";
  }
  const z3 = require("zod/v3");
  let v3Schema;
  try {
    v3Schema = evaluate(expression, z3);
  } catch (_) {
    // Zod 4's message is the one reported: it is the syntax tried first.
  }
  if (v3Schema instanceof z3.ZodType) {
    const { zodToJsonSchema } = require("zod-to-json-schema");
    return { ok: true, zod: "3", schema: zodToJsonSchema(v3Schema, { target: "jsonSchema7", $refStrategy: "root", removeAdditionalStrategy: "strict" }) };
  }
  return { ok: false, error: v4Error };
}

let answer;
try {
  answer = convert(readStdin());
} catch (e) {
  answer = { ok: false, error: message(e) };
}
process.stdout.write(JSON.stringify(answer));
