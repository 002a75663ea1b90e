package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// gatedApprovalAgent is approvalAgent whose tool does not run until the
// test lets it: run with a decision while the file $1.gate is missing, it
// appends a line to $1.refused and exits 1, which fails the turn; once the
// gate exists it is approvalAgent, whose line in $1 is the tool's run.
const gatedApprovalAgent = `req=$(cat)
case "$req" in
*'"approvals":['*) [ -e "$1.gate" ] || { echo refused >>"$1.refused"; exit 1; } ;;
esac
printf '%s' "$req" | {
` + approvalAgent + `}
`

// crashWorld is an approvalWorld whose daemon is a child process, killed
// with SIGKILL and started again on the same storage, running an exec
// agent script with the decisions file as $1.
type crashWorld struct {
	*approvalWorld
	bin, cfg string
	// door stands between the daemon and the homeserver when the world
	// holds a send.
	door   *sendHold
	daemon *daemonProcess
	addr   string
	starts int
}

// startCrashWorld starts a homeserver with the agent and alice on it and
// the daemon running script. With hold, the daemon reaches the homeserver
// through a sendHold that holds the send hold picks.
func startCrashWorld(t *testing.T, script string, hold func(body []byte) bool) *crashWorld {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	w := &crashWorld{approvalWorld: &approvalWorld{t: t, bot: hs.Register(t, "clerk", "clerk-password-0d7e"),
		alice: hs.User(t, hs.Register(t, "alice", "alice-password"))}, bin: bin}
	homeserver := hs.URL
	if hold != nil {
		w.door = startSendHold(t, hold, hs.URL)
		homeserver = w.door.URL
	}
	dir := t.TempDir()
	w.decisions = filepath.Join(dir, "decisions")
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(w.bot.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	w.cfg = writeExecScriptConfig(t, dir, homeserver, w.bot, script, w.decisions)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	w.ctx = ctx
	w.start()
	return w
}

// start runs the daemon and waits until it listens.
func (w *crashWorld) start() {
	w.t.Helper()
	d := startDaemonProcess(w.t, w.bin, w.cfg)
	w.starts++
	n := w.starts
	w.t.Cleanup(func() {
		if w.t.Failed() {
			w.t.Logf("the log of daemon %d:\n%s", n, d.log)
		}
	})
	w.daemon = d
	w.addr = daemonAddress(w.t, d.log)
}

// askAcknowledged has alice ask for call in room and returns the card's
// event ID once the daemon has recorded it as the homeserver acknowledged
// it. A vote counts only as a reaction or reply to that event, so a vote
// sent after this is a vote on a known card, not a race with the
// acknowledgement.
func (w *crashWorld) askAcknowledged(room, call string) string {
	w.t.Helper()
	card := w.ask(room, call)
	awaitNothingUnacknowledged(w.t, w.addr, "script")
	return card
}

// reply has alice reply text to card.
func (w *crashWorld) reply(room, card, text string) {
	w.t.Helper()
	w.alice.Send(room, "m.room.message", map[string]any{"msgtype": "m.text", "body": "> <" + w.bot.UserID + "> the card\n\n" + text,
		"m.relates_to": map[string]any{"m.in_reply_to": map[string]any{"event_id": card}}})
}

// awaitFile waits until path exists, failing the test when the world's
// time runs out first.
func (w *crashWorld) awaitFile(path, what string) {
	w.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := os.Stat(path)
		if err == nil {
			return
		}
		if !errors.Is(err, os.ErrNotExist) {
			w.t.Fatal(err)
		}
		select {
		case <-tick.C:
		case <-w.ctx.Done():
			w.t.Fatalf("%s never happened; the daemon's log:\n%s", what, w.daemon.log)
		}
	}
}

// checkDecidedOnceAfterAll waits until the card of call shows the decision
// want ("<call> <state> <by>") and the agent answered it, has alice ask
// once more so the daemon has judged everything the room said before,
// and then checks that the card was edited once, to the decision, the
// agent was told of it once, and answered once. It returns the edit.
func (w *crashWorld) checkDecidedOnceAfterAll(room, card, want, shows string) approvalContent {
	w.t.Helper()
	call, rest, _ := strings.Cut(want, " ")
	state, _, _ := strings.Cut(rest, " ")
	w.awaitDecided(room, card, want)
	w.barrier(room, call+"-barrier")
	w.checkDecidedOnce(room, card, call, state)
	var (
		edit    approvalContent
		answers []string
	)
	for _, raw := range w.alice.Messages(room) {
		c := readApprovalContent(raw)
		switch {
		case c.Content.Relates.RelType == "m.replace" && c.Content.Relates.EventID == card:
			edit = c
		case c.Sender == w.bot.UserID && c.Content.NewContent == nil && strings.HasPrefix(c.Content.Body, "decided "+call+" "):
			answers = append(answers, c.Content.Body)
		}
	}
	if !strings.HasPrefix(edit.Content.NewContent.Body, shows) {
		w.t.Fatalf("the card's edit shows %q, want it to start %q", edit.Content.NewContent.Body, shows)
	}
	if len(answers) != 1 || answers[0] != "decided "+want {
		w.t.Fatalf("the agent answered the decision of %s with %q, want once, %q", call, answers, "decided "+want)
	}
	return edit
}

// cardEdit reports whether a send's content is a card's edit: the final
// stage of an approval's delivery.
func cardEdit(body []byte) bool {
	var c struct {
		Delivery *struct {
			DeliveryID string `json:"delivery_id"`
			Stage      string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	}
	return json.Unmarshal(body, &c) == nil && c.Delivery != nil && strings.HasPrefix(c.Delivery.DeliveryID, "approval:") &&
		c.Delivery.Stage == "final"
}

// Votes that reach the homeserver while the daemon is dead are judged
// after it restarts: the first decides, the same approver's second vote
// is consumed, and the call is decided, shown and told to the agent once.
func TestKilledBeforeTheApproversReactionIsAdmittedTheCallIsDecidedOnce(t *testing.T) {
	w := startCrashWorld(t, approvalAgent, nil)
	room := w.room()
	card := w.askAcknowledged(room, "dead-1")
	w.daemon.kill(t)

	w.alice.React(room, card, "✅")
	w.reply(room, card, "approve")
	w.start()

	w.checkDecidedOnceAfterAll(room, card, "dead-1 approved "+w.alice.UserID, "Approved by "+w.alice.UserID)
	w.daemon.stop(t)
}

// A daemon killed after it decided a call and sent the card's edit, before
// it learned the homeserver took the edit, reconciles that edit after the
// restart rather than send the card's edit again.
func TestKilledBetweenTheDecisionAndItsCardEditTheCardIsEditedOnce(t *testing.T) {
	// The tool is gated until after the kill, so the kill never falls
	// between the command's run and the record of its answer: a command run
	// again there would run twice whatever the card does, which is not what
	// this test is about.
	w := startCrashWorld(t, gatedApprovalAgent, cardEdit)
	room := w.room()
	card := w.askAcknowledged(room, "edit-1")

	// The edit is enqueued with the decision, in one commit: once the
	// proxy holds it, the decision is recorded. The proxy passes the edit
	// on and holds every answer from then on, the sync's too, so the daemon
	// dies knowing neither the edit's event ID nor its echo.
	w.door.arm()
	w.alice.React(room, card, "✅")
	var shown string
	select {
	case shown = <-w.door.forwarded:
	case <-w.ctx.Done():
		t.Fatalf("the card's edit never reached the homeserver; the daemon's log:\n%s", w.daemon.log)
	}
	if shown == "" {
		t.Fatal("the homeserver refused the card's edit the proxy passed on")
	}
	w.daemon.kill(t)
	w.door.disarm()
	if err := os.WriteFile(w.decisions+".gate", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w.start()

	edit := w.checkDecidedOnceAfterAll(room, card, "edit-1 approved "+w.alice.UserID, "Approved by "+w.alice.UserID)
	if edit.ID != shown {
		t.Fatalf("the card's one edit is %s; the homeserver took the held edit as %s", edit.ID, shown)
	}
	w.daemon.stop(t)
}

// A daemon killed after a call was decided, while the turn that resumes
// with the decision has not run the tool yet, runs it once after the
// restart: the decision is read from the ledger, not voted again, and the
// turn is offered once.
func TestKilledBetweenTheDecisionAndTheAgentsResumptionTheToolRunsOnce(t *testing.T) {
	w := startCrashWorld(t, gatedApprovalAgent, nil)
	room := w.room()
	card := w.askAcknowledged(room, "resume-1")

	w.alice.React(room, card, "✅")
	// The command is run with the decision only once the decision is
	// committed; its refusal is the sign the daemon resumed the turn.
	w.awaitFile(w.decisions+".refused", "the turn's resumption with the decision")
	w.daemon.kill(t)
	if err := os.WriteFile(w.decisions+".gate", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w.start()

	w.checkDecidedOnceAfterAll(room, card, "resume-1 approved "+w.alice.UserID, "Approved by "+w.alice.UserID)
	w.daemon.stop(t)
}
