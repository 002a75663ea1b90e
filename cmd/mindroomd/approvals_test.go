package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// approvalAgent is an exec agent, a shell script, that asks a person
// before it "sends mail" for each message, the message's text being the
// call's ID: a text starting short- expires in 3 seconds, one starting
// carol- is for carol to decide, any other for its sender. Run again with
// the decision, it appends "<call> <state> <decided by>" to the file $1
// and answers "decided <call> <state> <decided by>".
const approvalAgent = `req=$(cat)
decided=$(printf '%s' "$req" | sed -n 's/.*"approvals":\[{"call_id":"\([^"]*\)".*"state":"\([a-z]*\)","decided_by":"\([^"]*\)".*/\1 \2 \3/p')
if [ -n "$decided" ]; then
	printf '%s\n' "$decided" >>"$1"
	printf '{"body": "decided %s"}' "$decided"
	exit 0
fi
body=$(printf '%s' "$req" | sed -n 's/.*"body":"\([^"]*\)","conversation":.*/\1/p')
case "$body" in
"") printf '{"ignore": true}' ;;
short-*) printf '{"approval": {"call_id": "%s", "tool": "send_mail", "arguments": {"to": "%s"}, "expires_in_s": 3}}' "$body" "$body" ;;
carol-*) printf '{"approval": {"call_id": "%s", "tool": "send_mail", "arguments": {"to": "%s"}, "approvers": ["%s"]}}' "$body" "$body" "$2" ;;
*) printf '{"approval": {"call_id": "%s", "tool": "send_mail", "arguments": {"to": "%s", "token": "s3cret"}, "secret": ["token"], "rendering": "Mail %s?"}}' "$body" "$body" "$body" ;;
esac
`

// approvalWorld is one daemon running approvalAgent, with alice, bob and
// carol on its homeserver.
type approvalWorld struct {
	t                 *testing.T
	ctx               context.Context
	bot               dendrite.Account
	alice, bob, carol *dendrite.User
	decisions         string
	d                 *inProcess
}

func startApprovalWorld(t *testing.T) *approvalWorld {
	t.Helper()
	hs := dendrite.Start(t)
	w := &approvalWorld{t: t, bot: hs.Register(t, "clerk", "clerk-password-51c9"),
		alice: hs.User(t, hs.Register(t, "alice", "alice-password")),
		bob:   hs.User(t, hs.Register(t, "bob", "bob-password")),
		carol: hs.User(t, hs.Register(t, "carol", "carol-password"))}
	dir := t.TempDir()
	w.decisions = filepath.Join(dir, "decisions")
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(w.bot.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeExecScriptConfig(t, dir, hs.URL, w.bot, approvalAgent, w.decisions, w.carol.UserID)
	w.d = runInProcess(cfg)
	t.Cleanup(func() {
		w.d.stopCleanly(t)
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", w.d.log)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	w.ctx = ctx
	return w
}

// room is a new room of alice's with the agent in it, and bob and carol
// when with says so.
func (w *approvalWorld) room(with ...*dendrite.User) string {
	w.t.Helper()
	invite := []string{w.bot.UserID}
	for _, u := range with {
		invite = append(invite, u.UserID)
	}
	room := w.alice.CreateRoom(invite...)
	for _, u := range with {
		u.Join(room)
	}
	w.alice.AwaitEvent(w.ctx, room, dendrite.Joined(w.bot.UserID, 1))
	return room
}

// approvalContent reads what the approval tests look at in an event.
type approvalContent struct {
	ID      string `json:"event_id"`
	Sender  string `json:"sender"`
	Type    string `json:"type"`
	Content struct {
		MsgType  string `json:"msgtype"`
		Body     string `json:"body"`
		Approval *struct {
			CallID string `json:"call_id"`
			State  string `json:"state"`
		} `json:"io.mindroomd.approval"`
		Relates struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
		NewContent *struct {
			Body     string `json:"body"`
			Approval *struct {
				CallID string `json:"call_id"`
				State  string `json:"state"`
			} `json:"io.mindroomd.approval"`
		} `json:"m.new_content"`
	} `json:"content"`
}

func readApprovalContent(raw json.RawMessage) approvalContent {
	var c approvalContent
	_ = json.Unmarshal(raw, &c)
	return c
}

// ask has alice ask for call in room and returns the event ID of its card
// once she sees it.
func (w *approvalWorld) ask(room, call string) string {
	w.t.Helper()
	q := w.alice.SendText(room, call)
	card := readApprovalContent(w.alice.AwaitEvent(w.ctx, room, func(raw json.RawMessage) bool {
		c := readApprovalContent(raw)
		return c.Sender == w.bot.UserID && c.Content.Approval != nil && c.Content.Approval.CallID == call &&
			c.Content.NewContent == nil
	}))
	if card.Content.MsgType != "m.notice" || !strings.Contains(card.Content.Body, "send_mail") {
		w.t.Fatalf("the card of %s (asked in %s) = %+v", call, q, card)
	}
	if strings.Contains(card.Content.Body, "s3cret") {
		w.t.Fatalf("the card shows a secret argument: %q", card.Content.Body)
	}
	return card.ID
}

// awaitDecided waits until alice sees the card's edit and the agent's
// answer to the decision want ("<call> <state> <by>"), then checks that
// the card was edited once, to state, and that the agent was told one
// decision of the call.
func (w *approvalWorld) awaitDecided(room, card, want string) {
	w.t.Helper()
	call, state, _ := strings.Cut(want, " ")
	state, _, _ = strings.Cut(state, " ")
	w.alice.AwaitEvent(w.ctx, room, func(raw json.RawMessage) bool {
		c := readApprovalContent(raw)
		return c.Sender == w.bot.UserID && c.Content.NewContent == nil &&
			strings.TrimSpace(c.Content.Body) == strings.TrimSpace("decided "+want)
	})
	w.alice.AwaitEvent(w.ctx, room, func(raw json.RawMessage) bool {
		c := readApprovalContent(raw)
		return c.Content.Relates.RelType == "m.replace" && c.Content.Relates.EventID == card
	})
	w.checkDecidedOnce(room, card, call, state)
}

// checkDecidedOnce checks that the room holds one edit of card, showing
// state, and that the agent was told of call's decision once.
func (w *approvalWorld) checkDecidedOnce(room, card, call, state string) {
	w.t.Helper()
	var edits []approvalContent
	for _, raw := range w.alice.Messages(room) {
		if c := readApprovalContent(raw); c.Content.Relates.RelType == "m.replace" && c.Content.Relates.EventID == card {
			edits = append(edits, c)
		}
	}
	if len(edits) != 1 {
		w.t.Fatalf("the card of %s was edited %d times, want once: %+v", call, len(edits), edits)
	}
	if nc := edits[0].Content.NewContent; nc == nil || nc.Approval == nil || nc.Approval.State != state ||
		strings.Contains(nc.Body, "s3cret") {
		w.t.Fatalf("the card's edit = %+v, want it to show %s", edits[0], state)
	}
	raw, err := os.ReadFile(w.decisions)
	if err != nil {
		w.t.Fatal(err)
	}
	var told []string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, call+" ") {
			told = append(told, line)
		}
	}
	if len(told) != 1 || !strings.HasPrefix(told[0], call+" "+state) {
		w.t.Fatalf("the agent was told of %s: %q, want one decision, %s", call, told, state)
	}
}

// barrier has alice ask once more in room and waits for the card: the
// daemon has judged everything the room said before.
func (w *approvalWorld) barrier(room, call string) { w.t.Helper(); w.ask(room, call) }

func TestToolApprovalsAreDecidedInTheRoom(t *testing.T) {
	w := startApprovalWorld(t)

	t.Run("ApproveByReaction", func(t *testing.T) {
		room := w.room()
		card := w.ask(room, "react-1")
		w.alice.React(room, card, "✅")
		w.awaitDecided(room, card, "react-1 approved "+w.alice.UserID)
	})

	t.Run("DenyByReply", func(t *testing.T) {
		room := w.room()
		card := w.ask(room, "reply-1")
		w.alice.Send(room, "m.room.message", map[string]any{"msgtype": "m.text", "body": "> <" + w.bot.UserID + "> the card\n\ndeny",
			"m.relates_to": map[string]any{"m.in_reply_to": map[string]any{"event_id": card}}})
		w.awaitDecided(room, card, "reply-1 denied "+w.alice.UserID)
	})

	t.Run("AStrangersReactionIsIgnored", func(t *testing.T) {
		room := w.room(w.bob)
		card := w.ask(room, "stranger-1")
		w.bob.React(room, card, "✅")
		w.barrier(room, "stranger-barrier")
		w.alice.React(room, card, "❌")
		w.awaitDecided(room, card, "stranger-1 denied "+w.alice.UserID)
	})

	t.Run("ADuplicateClickIsConsumed", func(t *testing.T) {
		room := w.room()
		card := w.ask(room, "twice-1")
		w.alice.React(room, card, "✅")
		w.awaitDecided(room, card, "twice-1 approved "+w.alice.UserID)
		w.alice.React(room, card, "❌")
		w.alice.Send(room, "m.room.message", map[string]any{"msgtype": "m.text", "body": "deny",
			"m.relates_to": map[string]any{"m.in_reply_to": map[string]any{"event_id": card}}})
		w.barrier(room, "twice-barrier")
		w.checkDecidedOnce(room, card, "twice-1", "approved")
	})

	t.Run("NobodyDecidesInTime", func(t *testing.T) {
		room := w.room()
		card := w.ask(room, "short-1")
		w.awaitDecided(room, card, "short-1 expired ")
	})

	t.Run("TheApproversKickWithdraws", func(t *testing.T) {
		room := w.room(w.carol)
		card := w.ask(room, "carol-1")
		w.alice.Kick(room, w.carol.UserID)
		w.awaitDecided(room, card, "carol-1 withdrawn ")
	})
}
