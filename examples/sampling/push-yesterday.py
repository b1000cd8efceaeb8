#!/usr/bin/env python3
"""Send yesterday's production samples of one skill to a skilleval server.

A daily cron job runs it shortly after midnight UTC, e.g.

    15 0 * * *  /opt/skilleval/push-yesterday.py --log /var/log/refund-triage/samples.jsonl \
                    --server https://skilleval.internal --skill refund-triage

It reads the JSON Lines log the skill's service writes (one sample a line: `sample_id`,
`version`, `observed_at`, `input`, `output`, `tool_calls`, `metadata`; see docs/monitoring.md),
keeps the lines observed yesterday (UTC), and hands them to

    skilleval samples push FILE.jsonl --server URL --skill NAME

which batches them, retries with the same sample ids and prints a summary. That client command
belongs to the service part of production monitoring, which is still to come: this script is
written against its documented interface (docs/monitoring.md, "HTTP API"). Re-running it is
safe: the server counts a re-sent sample_id as a duplicate and never grades it twice, and which
samples are graded is decided from their ids, so a retry grades the same ones.

To look at the same day offline, without a server:

    skilleval monitor yesterday.jsonl ./skills/refund-triage

Exit status: that of `skilleval samples push` (0 when it ran), 2 when the log cannot be read.
"""
import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile


def observed_day(line):
    """The UTC date a log line was observed, or None when it has no readable time."""
    try:
        sample = json.loads(line)
        stamp = sample["observed_at"].replace("Z", "+00:00")
        return dt.datetime.fromisoformat(stamp).astimezone(dt.timezone.utc).date()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", required=True, help="the skill's JSON Lines sample log")
    parser.add_argument("--server", required=True, help="the skilleval server's base URL")
    parser.add_argument("--skill", required=True, help="the skill's name on the server")
    parser.add_argument("--day", help="the UTC day to send (YYYY-MM-DD; default: yesterday)")
    parser.add_argument("--skilleval", default=os.environ.get("SKILLEVAL", "skilleval"),
                        help="the skilleval binary (default: $SKILLEVAL or skilleval on PATH)")
    args = parser.parse_args()

    day = (dt.date.fromisoformat(args.day) if args.day
           else dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1))
    kept = unreadable = 0
    try:
        with open(args.log, encoding="utf-8") as log, tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", suffix=".jsonl", prefix=f"samples-{day}-", delete=False) as out:
            for line in log:
                if not line.strip():
                    continue
                when = observed_day(line)
                if when is None:
                    # Not attributable to a day: counted and left for someone to look at
                    # (sending it every day would only make duplicates).
                    unreadable += 1
                    continue
                if when == day:
                    out.write(line if line.endswith("\n") else line + "\n")
                    kept += 1
            batch = out.name
    except OSError as e:
        print(f"error: cannot read {args.log}: {e}", file=sys.stderr)
        return 2
    print(f"{day}: {kept} sample(s) from {args.log} ({unreadable} line(s) without a readable time)",
          file=sys.stderr)
    try:
        if kept == 0:
            return 0
        command = [args.skilleval, "samples", "push", batch, "--server", args.server, "--skill", args.skill]
        return subprocess.run(command, check=False).returncode
    finally:
        os.unlink(batch)


if __name__ == "__main__":
    sys.exit(main())
