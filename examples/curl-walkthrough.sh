#!/usr/bin/env bash
# A walk through the agent API's routes with curl, against a running
# mindroomd: find the agent's rooms, post a keyed message (twice: one
# message), react and withdraw the reaction, show typing, read the room,
# list its members, take pending work and answer it (once with a file),
# and fetch a file a message carries.
#
#   API=http://127.0.0.1:8787/v1/agents/echo TOKEN=$(cat secrets/echo.api-token) \
#     bash examples/curl-walkthrough.sh
#
# It needs curl and jq. The agent must be in at least one room.
set -euo pipefail
: "${API:?set API to the agent's routes, e.g. http://127.0.0.1:8787/v1/agents/echo}"
: "${TOKEN:?set TOKEN to the agent's API token}"
auth=(-H "Authorization: Bearer $TOKEN")
enc() { jq -rn --arg v "$1" '$v|@uri'; }

echo "== the agent's rooms"
curl -fsS "${auth[@]}" "$API/rooms" | jq .
ROOM=$(curl -fsS "${auth[@]}" "$API/rooms" | jq -r '.rooms[0].room_id')
R=$(enc "$ROOM")

echo "== a keyed message, posted twice: the second is the same delivery, replayed"
key="walkthrough-$(date +%Y-%m-%d)"
for _ in 1 2; do
  curl -fsS "${auth[@]}" -H "Idempotency-Key: $key" -d '{"body":"Hello from the **walk-through**"}' \
    "$API/rooms/$R/send" | jq -c .
done

echo "== typing for five seconds"
curl -fsS "${auth[@]}" -X PUT -d '{"typing":true,"timeout_ms":5000}' "$API/rooms/$R/typing" | jq -c .

echo "== the room's newest messages and its members"
curl -fsS "${auth[@]}" "$API/rooms/$R/messages?limit=5" | jq -c '.messages[] | {event_id, sender, body: .content.body, attachment}'
curl -fsS "${auth[@]}" "$API/rooms/$R/members" | jq -c '.members[]'

echo "== a reaction to the newest message, added twice (one reaction) and withdrawn"
LAST=$(curl -fsS "${auth[@]}" "$API/rooms/$R/messages?limit=1" | jq -r '.messages[-1].event_id')
if [ "$LAST" != null ]; then
  E=$(enc "$LAST")
  curl -fsS "${auth[@]}" -d '{"key":"👀"}' "$API/events/$E/react" | jq -c .
  curl -fsS "${auth[@]}" -d '{"key":"👀"}' "$API/events/$E/react" | jq -c .
  curl -fsS "${auth[@]}" -X DELETE "$API/events/$E/react?key=$(enc 👀)" | jq -c . || true
fi

echo "== pending work: answer the first item, with a small file"
ITEM=$(curl -fsS "${auth[@]}" "$API/pending?limit=1" | jq -c '.events[0] // empty')
if [ -n "$ITEM" ]; then
  Q=$(enc "$(jq -r .event_id <<<"$ITEM")")
  printf 'answered by the walk-through\n' > /tmp/walkthrough-answer.txt
  curl -fsS "${auth[@]}" -F 'message={"body":"here is a note"}' \
    -F 'file=@/tmp/walkthrough-answer.txt;type=text/plain' "$API/events/$Q/reply" | jq -c .
else
  echo "(nothing pending)"
fi

echo "== the first file a message of the room carries, fetched through the API"
MXC=$(curl -fsS "${auth[@]}" "$API/rooms/$R/messages?limit=50" | jq -r '[.messages[].attachment.url // empty][0] // empty')
if [ -n "$MXC" ]; then
  curl -fsS "${auth[@]}" -o /tmp/walkthrough-file -D - "$API/media/${MXC#mxc://}" | grep -i '^content-type'
  wc -c /tmp/walkthrough-file
else
  echo "(no file in the last 50 messages)"
fi
