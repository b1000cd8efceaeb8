"""Calculator skill runner: reads the test input as JSON on stdin, prints the answer.

Expressions are evaluated by walking Python's AST with an allow-list of arithmetic nodes,
never with eval(), so a prompt cannot run code.
"""
import ast
import json
import operator
import re
import sys

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate(node):
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](left, right)
    raise ValueError("unsupported expression")


def answer(prompt):
    match = re.search(r"(?:calculate|compute|what is)\s*:?\s*(.+?)\??\s*$", prompt, re.IGNORECASE)
    expression = (match.group(1) if match else prompt).strip()
    try:
        value = evaluate(ast.parse(expression, mode="eval"))
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError):
        return "error: not an arithmetic expression"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def main():
    request = json.load(sys.stdin)
    print(answer(request.get("prompt", "")))


if __name__ == "__main__":
    main()
