// Command mcp-agent is an agent written against mindroomd's MCP tools
// instead of its HTTP API: it starts `mindroomd mcp` as a subprocess,
// speaks the Model Context Protocol to it over stdin and stdout through the
// official Go SDK, waits for work in a loop and answers each text message
// with "you said: " and the message reversed.
//
//	go run ./examples/mcp-agent -config .demo/mindroom.yaml -agent echo
//
// See README.md beside it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	mindroomd := flag.String("mindroomd", "mindroomd", "the mindroomd binary to run (bin/mindroomd after make build)")
	config := flag.String("config", "mindroom.yaml", "the daemon's configuration file")
	agent := flag.String("agent", "", "the agent to act for (default: the configuration's only agent)")
	api := flag.String("api", "", "the agent API's base URL (default: the configuration's listen address)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := []string{"mcp", "-config", *config}
	if *agent != "" {
		args = append(args, "-agent", *agent)
	}
	if *api != "" {
		args = append(args, "-api", *api)
	}
	cmd := exec.Command(*mindroomd, args...)
	// mindroomd mcp logs to its stderr; stdout is the protocol.
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "mcp-agent", Version: "v0.1.0"}, nil)
	session, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		log.Error("starting mindroomd mcp failed", "err", err)
		os.Exit(1)
	}
	// Closing the session closes the subprocess's stdin, which ends it.
	defer session.Close()
	if err := serve(ctx, session, log); err != nil && ctx.Err() == nil {
		log.Error("the agent stopped", "err", err)
		os.Exit(1)
	}
}

// work is wait_for_work's answer.
type work struct {
	Events []struct {
		EventID string `json:"event_id"`
		RoomID  string `json:"room_id"`
		Sender  string `json:"sender"`
		Content struct {
			MsgType string `json:"msgtype"`
			Body    string `json:"body"`
		} `json:"content"`
	} `json:"events"`
	NextAfter int64 `json:"next_after"`
}

// serve waits for work and answers it until ctx ends.
func serve(ctx context.Context, session *mcp.ClientSession, log *slog.Logger) error {
	// The cursor starts at 0: whatever a previous run left pending comes
	// first, since work stays pending until it is answered or ignored.
	var after int64
	for ctx.Err() == nil {
		var w work
		if err := call(ctx, session, "wait_for_work", map[string]any{"after": after, "wait_seconds": 30}, &w); err != nil {
			var te *toolError
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case !errors.As(err, &te):
				return err // the session is gone
			}
			// The daemon is restarting, say: try again shortly.
			log.Warn("waiting for work failed", "err", err)
			sleep(ctx, 5*time.Second)
			continue
		}
		next, retry := w.NextAfter, false
		for _, ev := range w.Events {
			var err error
			if ev.Content.MsgType == "m.text" && ev.Content.Body != "" {
				answer := "you said: " + reverse(ev.Content.Body)
				err = call(ctx, session, "reply", map[string]any{"event_id": ev.EventID, "body": answer}, nil)
				log.Info("answered", "room", ev.RoomID, "sender", ev.Sender, "event", ev.EventID, "err", err)
			} else {
				// Reactions, images, notices: nothing to say.
				err = call(ctx, session, "ignore", map[string]any{"event_id": ev.EventID}, nil)
			}
			var te *toolError
			switch {
			case err == nil:
			case ctx.Err() != nil:
				return ctx.Err()
			case !errors.As(err, &te):
				return err
			case te.Code == "conflict" || te.Code == "not_found":
				// Someone settled it first (another run of this agent):
				// nothing is owed any more.
			case te.Status >= 400 && te.Status < 500:
				// The answer itself is refused (too long, say): settle
				// the event rather than retry it forever.
				_ = call(ctx, session, "ignore", map[string]any{"event_id": ev.EventID}, nil)
			default:
				// Still pending: read from the start again, after a
				// pause, so it comes back.
				next, retry = 0, true
			}
		}
		after = next
		if retry {
			sleep(ctx, 5*time.Second)
		}
	}
	return ctx.Err()
}

// toolError is a tool's refusal: the agent API's error code and message.
type toolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

func (e *toolError) Error() string { return e.Code + ": " + e.Message }

// call calls a tool and decodes its structured result into out; a tool's
// refusal is a *toolError, anything else a failure of the session.
func call(ctx context.Context, session *mcp.ClientSession, tool string, args map[string]any, out any) error {
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return err
	}
	if res.IsError {
		te := &toolError{}
		if json.Unmarshal(b, te) != nil || te.Code == "" {
			te.Code, te.Message = "error", fmt.Sprint(res.Content)
		}
		return te
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// reverse reverses a text by runes.
func reverse(s string) string {
	r := []rune(strings.TrimSpace(s))
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
