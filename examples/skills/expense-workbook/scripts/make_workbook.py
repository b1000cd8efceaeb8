#!/usr/bin/env python3
# /// script
# requires-python = ">=3.9"
# dependencies = [
#   "openpyxl>=3.1",
# ]
# ///
"""Writes an expense workbook from a CSV export.

Usage: make_workbook.py INPUT.csv OUTPUT.xlsx

INPUT.csv needs a header row with `date`, `category` and `amount` (a decimal number). The
workbook has two sheets: `Expenses` (date, category, amount per row, in input order) and
`Totals` (category and total, largest total first, then a `TOTAL` row). Totals are rounded to
cents. Prints `N expenses, total T, largest category C` on success; on a bad row, exits 2
naming the row and the column.
"""

import csv
import sys
from decimal import Decimal, InvalidOperation

from openpyxl import Workbook


def main(argv):
    if len(argv) != 3:
        print("usage: make_workbook.py INPUT.csv OUTPUT.xlsx", file=sys.stderr)
        return 2
    source, target = argv[1], argv[2]
    rows = []
    with open(source, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"date", "category", "amount"} - set(reader.fieldnames or [])
        if missing:
            print(f"{source}: missing column(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
        for n, row in enumerate(reader, start=2):
            try:
                amount = Decimal(row["amount"].strip())
            except (InvalidOperation, AttributeError):
                print(f"{source}: row {n}, column amount: not a number: {row['amount']!r}", file=sys.stderr)
                return 2
            rows.append((row["date"].strip(), row["category"].strip(), amount))

    totals = {}
    for _, category, amount in rows:
        totals[category] = totals.get(category, Decimal(0)) + amount
    ordered = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    grand = sum(totals.values(), Decimal(0))

    book = Workbook()
    sheet = book.active
    sheet.title = "Expenses"
    sheet.append(["date", "category", "amount"])
    for date, category, amount in rows:
        sheet.append([date, category, float(amount)])
    summary = book.create_sheet("Totals")
    summary.append(["category", "total"])
    for category, total in ordered:
        summary.append([category, float(total.quantize(Decimal("0.01")))])
    summary.append(["TOTAL", float(grand.quantize(Decimal("0.01")))])
    book.save(target)

    largest = ordered[0][0] if ordered else "none"
    print(f"{len(rows)} expenses, total {grand:.2f}, largest category {largest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
