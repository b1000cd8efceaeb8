"""Builds report.json from a sales CSV.

Usage: build_report.py INPUT.csv OUTPUT.json

The report:
  total         sum of `amount` over all rows (a number, 2 decimals)
  rows          number of data rows
  by_region     {region: total}, regions sorted by name
  by_product    {product: total}, products sorted by name
  top_region    the region with the largest total (ties: first by name)
"""

import csv
import json
import sys


def main(argv):
    if len(argv) != 3:
        print("usage: build_report.py INPUT.csv OUTPUT.json", file=sys.stderr)
        return 2
    by_region, by_product, total, rows = {}, {}, 0.0, 0
    with open(argv[1], newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"region", "product", "amount"} - set(reader.fieldnames or [])
        if missing:
            print(f"missing column(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 1
        for n, row in enumerate(reader, start=2):
            try:
                amount = float(row["amount"])
            except ValueError:
                print(f"row {n}: column amount: not a number: {row['amount']!r}", file=sys.stderr)
                return 1
            rows += 1
            total += amount
            by_region[row["region"]] = by_region.get(row["region"], 0.0) + amount
            by_product[row["product"]] = by_product.get(row["product"], 0.0) + amount
    report = {
        "total": round(total, 2),
        "rows": rows,
        "by_region": {k: round(by_region[k], 2) for k in sorted(by_region)},
        "by_product": {k: round(by_product[k], 2) for k in sorted(by_product)},
        "top_region": max(sorted(by_region), key=lambda k: by_region[k]) if by_region else None,
    }
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"{rows} rows, total {report['total']:.2f}, top region {report['top_region']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
