#!/usr/bin/env python3
"""A mindroomd exec agent: answers each text message with "echo: " and its body.

mindroomd runs it once per turn, writes one JSON request on its stdin and
reads one JSON reply from its stdout. See README.md beside it.
"""
import json
import sys


def main() -> int:
    request = json.load(sys.stdin)
    event = request["event"]
    if event.get("type") != "m.room.message" or not request["body"]:
        # Reactions, media without a caption, and the like: settle unanswered.
        json.dump({"ignore": True}, sys.stdout)
        return 0
    json.dump({"body": "echo: " + request["body"]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
