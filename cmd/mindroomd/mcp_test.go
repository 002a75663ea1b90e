package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// mcpCommandSession starts the built binary's mcp subcommand with args and
// returns an SDK client's session of it over its stdin and stdout.
func mcpCommandSession(t *testing.T, args ...string) *mcp.ClientSession {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"mcp"}, args...)...)
	// A -race binary otherwise sleeps a second on each clean exit.
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		// Closing stdin ends the server; the process must then exit by itself.
		if err := cs.Close(); err != nil {
			t.Errorf("close: %v\n%s", err, stderr.String())
		}
		if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
			t.Errorf("mcp exited %v\n%s", cmd.ProcessState, stderr.String())
		}
		if !strings.Contains(stderr.String(), `"message":"Serving MCP on stdio"`) {
			t.Errorf("stderr lacks the JSON log:\n%s", stderr.String())
		}
	})
	return cs
}

// mcpTool calls a tool that must succeed and decodes its structured content.
func mcpTool[T any](t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if res.IsError {
		t.Fatalf("%s failed: %s", name, b)
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %s: %v", name, b, err)
	}
	return out
}

// The real binary's mcp subcommand, pointed at a daemon's agent API by the
// configuration's listen address and the agent's api_token_file, serves
// the agent's tools over stdio: it reads a conversation, takes pending
// work and answers it through the API.
func TestMCPCommandServesTheAgentsToolsOverStdio(t *testing.T) {
	storage, srv := exportFixture(t, 3)
	cfg := exportConfig(t, storage, strings.TrimPrefix(srv.URL, "http://"), "helper")
	cs := mcpCommandSession(t, "-config", cfg)
	if info := cs.InitializeResult().ServerInfo; info.Name != "mindroomd" || info.Version != stampedVersion {
		t.Fatalf("server info %+v", info)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	want := []string{"ignore", "leave", "list_rooms", "react", "read_conversation", "reply", "request_approval", "send",
		"wait_for_decision", "wait_for_work"}
	if got := slices.Sorted(slices.Values(names)); !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}
	page := mcpTool[struct {
		Messages []struct {
			EventID string `json:"event_id"`
		} `json:"messages"`
		NextCursor *string `json:"next_cursor"`
	}](t, cs, "read_conversation", map[string]any{"room_id": exportRoom, "limit": 2})
	if len(page.Messages) != 2 || page.Messages[1].EventID != "$n7" || page.NextCursor == nil {
		t.Fatalf("newest page = %+v", page)
	}
	work := mcpTool[struct {
		Events []struct {
			EventID string `json:"event_id"`
		} `json:"events"`
		NextAfter int64 `json:"next_after"`
	}](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0, "limit": 1})
	if len(work.Events) != 1 || work.NextAfter == 0 {
		t.Fatalf("work = %+v", work)
	}
	reply := mcpTool[struct{ Outcome, DeliveryID string }](t, cs, "reply",
		map[string]any{"event_id": work.Events[0].EventID, "body": "seen"})
	if reply.Outcome != "created" {
		t.Fatalf("reply = %+v", reply)
	}
}

// -api overrides the listen address, and -agent picks one of several
// agents; without it a configuration of several agents is a usage error.
func TestMCPCommandTakesTheAgentAndTheAPIFromItsFlags(t *testing.T) {
	storage, srv := exportFixture(t, 3)
	cfg := exportConfig(t, storage, "127.0.0.1:1", "helper", "other")
	cs := mcpCommandSession(t, "-config", cfg, "-agent", "helper", "-api", srv.URL)
	if rooms := mcpTool[map[string]any](t, cs, "read_conversation", map[string]any{"room_id": exportRoom}); rooms["messages"] == nil {
		t.Fatalf("page = %v", rooms)
	}

	code, _, stderr := mindroomd(t, "mcp", "-config", cfg)
	if code != exitUsage || !strings.Contains(stderr, "-agent is required") || !strings.Contains(stderr, "mindroomd mcp -h") {
		t.Fatalf("no -agent: exit %d\n%s", code, stderr)
	}
	code, _, stderr = mindroomd(t, "mcp", "-config", cfg, "-agent", "nobody")
	if code != exitUsage || !strings.Contains(stderr, `no agent "nobody"`) {
		t.Fatalf("-agent nobody: exit %d\n%s", code, stderr)
	}
	code, _, stderr = mindroomd(t, "mcp", "-config", cfg, "-agent", "helper", "-api", "ftp://example.org")
	if code != exitUsage || !strings.Contains(stderr, "-api") {
		t.Fatalf("-api ftp: exit %d\n%s", code, stderr)
	}
	code, stdout, _ := mindroomd(t, "mcp", "-h")
	if code != exitOK || !strings.Contains(stdout, "-agent") || !strings.Contains(stdout, "-api") || !strings.Contains(stdout, "-config") {
		t.Fatalf("mcp -h: exit %d\n%s", code, stdout)
	}
}

// A wrong token fails each tool with the API's refusal; the process keeps
// serving.
func TestMCPCommandReportsTheAPIsRefusalAsAToolError(t *testing.T) {
	storage, srv := exportFixture(t, 3)
	cfg := exportConfig(t, storage, strings.TrimPrefix(srv.URL, "http://"), "other", "helper")
	// The first agent's file holds the token the API knows for helper; the
	// second's, helper's in this configuration, holds another.
	cs := mcpCommandSession(t, "-config", cfg, "-agent", "helper")
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_rooms", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !res.IsError || !strings.Contains(string(b), `"code":"unauthorized"`) || !strings.Contains(string(b), `"status":401`) {
		t.Fatalf("list_rooms = %s", b)
	}
}

// A signal ends mcp at once with exit 0, though its client still holds
// stdin open.
func TestMCPCommandEndsOnASignal(t *testing.T) {
	storage, srv := exportFixture(t, 3)
	cfg := exportConfig(t, storage, strings.TrimPrefix(srv.URL, "http://"), "helper")
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "mcp", "-config", cfg)
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	log := &logbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(log.String(), "Serving MCP on stdio") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("mcp did not start:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Logf("exited %s after SIGTERM", time.Since(start))
		if err != nil || time.Since(start) > 10*time.Second {
			t.Fatalf("mcp exited after %s: %v\n%s", time.Since(start), err, log.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("mcp did not exit on SIGTERM:\n%s", log.String())
	}
}
