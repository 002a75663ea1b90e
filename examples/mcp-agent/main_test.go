package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The loop answers each text message, reversed, and settles a reaction
// unanswered, through the MCP tools of a real agent API; the tools run in
// memory here instead of in a mindroomd mcp subprocess.
func TestTheAgentAnswersTextAndIgnoresTheRest(t *testing.T) {
	st, _ := testsupport.MustOpen(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	view, err := st.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	const room = "!r:example.org"
	if _, err := view.AdmitBatch(ctx, mx.Live(room, mx.Message("$q", "@alice:example.org", 1000, "hello"),
		mx.Reaction("$like", "@alice:example.org", 1001, "$q", "👍")), ""); err != nil {
		t.Fatal(err)
	}
	handler := api.New(api.Deps{Agents: map[string]api.Agent{"helper": {Store: view, Token: "secret", Hints: st.Hints()}},
		Log: zerolog.Nop()})
	server := mcpserver.New(mcpserver.Options{Agent: "helper", Handler: handler, Token: "secret"})
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "mcp-agent", Version: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve(runCtx, session, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	for {
		page, err := view.Pending(ctx, 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("still pending: %d events", len(page.Events))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != context.Canceled {
		t.Fatalf("serve ended with %v", err)
	}
	d, err := view.Delivery(ctx, "reply:$q", journal.StageFinal)
	if err != nil || !strings.Contains(string(d.Content), `"you said: olleh"`) {
		t.Fatalf("the answer: %s %v", d.Content, err)
	}
	if _, err := view.Delivery(ctx, "reply:$like", journal.StageFinal); err == nil {
		t.Fatal("the reaction was answered")
	}
}

func TestReverseReversesRunes(t *testing.T) {
	if got := reverse(" héllo 👋 "); got != "👋 olléh" {
		t.Fatalf("reverse = %q", got)
	}
}
