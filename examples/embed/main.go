// Command embed shows mindroomd embedded in a Go program with an agent
// written in Go: it opens the journal, signs the agent in, starts its
// principal (sync loop, turns, delivery) and runs until SIGINT or SIGTERM,
// then stops the principal before it closes the journal.
//
// The agent answers a text message with "you said: " and the message in
// upper case, then what the same person said just before, read from the
// conversation as the journal shows it (edits applied, redactions gone).
//
//	MINDROOM_PASSWORD=... go run ./examples/embed -homeserver http://127.0.0.1:8008 -user @shout:localhost
//
// The password comes from the environment only, as a command line is
// visible to every user of the machine. Exit codes: 0 stopped by a signal
// (or -h), 1 a failure, 2 a usage error.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
)

// recent is how many of the newest messages the agent reads per turn.
const recent = 10

// options are the command line's, and the password.
type options struct {
	homeserver, storage, userID, name, password string
}

func main() {
	var o options
	flag.StringVar(&o.homeserver, "homeserver", os.Getenv("MINDROOM_HOMESERVER"),
		"homeserver URL (env MINDROOM_HOMESERVER)")
	flag.StringVar(&o.storage, "storage", cmp.Or(os.Getenv("MINDROOM_STORAGE"), journal.DefaultStorageDir),
		"storage directory (env MINDROOM_STORAGE)")
	flag.StringVar(&o.userID, "user", "", "the agent's Matrix user ID, e.g. @shout:example.org")
	flag.StringVar(&o.name, "name", "shout", "the agent's name in the journal")
	flag.Parse() // exits 2 on a bad flag, 0 after -h
	o.password = os.Getenv("MINDROOM_PASSWORD")
	if o.homeserver == "" || o.userID == "" || o.password == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "embed: -homeserver, -user and MINDROOM_PASSWORD are required, and nothing else")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second signal ends the process at once
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run serves the agent until ctx ends or a fault stops the journal or the
// principal, then stops the principal and closes the journal, in that order.
func run(ctx context.Context, o options) (err error) {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("agent", o.name).Logger()
	// One actor system for the journal's writer and the principal.
	system := actors.NewSystem(log)
	s, err := store.Open(ctx, store.Options{StorageDir: o.storage, Log: log, System: system})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }() // last: commits what was handed over
	view, err := s.Principal(ctx, o.name, o.userID)
	if err != nil {
		return err
	}
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: o.homeserver, UserID: o.userID, Password: o.password,
		Agent: o.name, StorageDir: o.storage, Log: log})
	if err != nil {
		return err
	}
	faults := make(chan error, 1)
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: client, Agent: shout{},
		Sender: matrix.NewSender(client), Reconciler: matrix.NewReconciler(client), DeviceID: client.DeviceID(),
		Hints: s.Hints(), AutoJoin: true, Log: log,
		OnFault: func(err error) {
			select {
			case faults <- err:
			default: // one fault is enough to stop for
			}
		},
	}))
	defer func() { // runs before the journal's Close
		if serr := system.Root.StopFuture(pid).Wait(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop principal: %w", serr))
		}
	}()
	log.Info().Str("user_id", client.UserID()).Str("device_id", client.DeviceID()).Msg("Agent running")

	select {
	case <-ctx.Done():
		log.Info().Msg("Shutting down")
		return nil
	case <-s.Done():
		return fmt.Errorf("journal writer stopped: %w", s.Fatal())
	case err := <-faults:
		return fmt.Errorf("principal stopped: %w", err)
	}
}

// shout is the agent: plain Go code behind agent.Agent.
type shout struct{}

// Answer implements agent.Agent. An error leaves the event pending, to
// be offered again after a backoff.
func (shout) Answer(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
	if turn.Event.Kind != journal.KindMessage {
		return agent.Reply{Ignore: true}, nil // reactions, media, …: settled unanswered
	}
	body, err := agent.Body(turn.Event.Event)
	if err != nil {
		return agent.Reply{}, err
	}
	page, err := turn.Conversation.Read(ctx,
		journal.ReadRequest{RoomID: turn.Event.RoomID, Thread: turn.Thread, Limit: recent})
	if err != nil {
		return agent.Reply{}, fmt.Errorf("read conversation: %w", err)
	}
	// The page is oldest first. The event is on it unless more than
	// `recent` messages came after it (i < 0): then nothing is repeated.
	i := slices.IndexFunc(page.Messages, func(m journal.Message) bool { return m.EventID == turn.Event.EventID })
	var earlier []string
	for _, m := range page.Messages[:max(i, 0)] {
		if m.Sender == page.Messages[i].Sender {
			earlier = append(earlier, strings.ToUpper(textOf(m.Content)))
		}
	}
	text := "you said: " + strings.ToUpper(body)
	if len(earlier) > 0 {
		text += " (before that: " + strings.Join(earlier, " / ") + ")"
	}
	content, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": text})
	return agent.Reply{Content: content}, err
}

// textOf reads a content's body by its exact key; "" when none is text.
func textOf(content json.RawMessage) string {
	var c map[string]any
	_ = json.Unmarshal(content, &c)
	body, _ := c["body"].(string)
	return body
}
