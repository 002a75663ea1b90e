package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	mcpAgent = "bench"
	mcpRoom  = "!mcp:example.org"
	mcpToken = "bench-mcp-token"
	mcpBody  = "Thanks, the report is attached to the ticket and the numbers match last week's."
)

// mcpSizes are BenchmarkMCPReply's knobs: calls per arm in one turn, and
// cycles of turns per iteration (each cycle one turn of every arm).
func mcpSizes() (perTurn, cycles int) {
	if testing.Short() {
		return 10, 2
	}
	return 100, 6
}

// BenchmarkMCPReply measures an agent's reply through `mindroomd mcp` (the
// built binary, a subprocess speaking MCP on stdio, calling the agent API
// over loopback HTTP) against the same reply posted to the agent API
// directly over the same loopback HTTP. The API is api.New over an
// on-disk journal (synchronous=FULL), as a running daemon serves it.
// Pending events are admitted up front; each call answers a fresh one, one
// call at a time, as one agent answers its work.
//
// Beside the replies, a cheap successful call, the room's newest message
// (read_conversation with limit 1 against GET .../messages?limit=1), is
// measured the same way: its difference is the floor of what MCP adds to
// any call. A third read arm makes the same MCP call to the same server
// code (mcpserver.New) inside this process over an os.Pipe pair, the
// transport `mindroomd mcp` uses on stdio, to split that floor into the
// SDK's and the server's per-call work and the process boundary.
//
// The arms take turns: a cycle is one turn of each, the two reply arms and
// the three read arms each in reverse order every other cycle, after an
// unmeasured turn of each.
//
// Metrics: mcp-p50-ms, http-p50-ms, mcp-p99-ms, http-p99-ms over every
// reply; mcp/http, the median of the turns' p50 ratios, with ratio-min
// and ratio-max; mcp-replies/s and http-replies/s; reply-diff-ms, the
// median of the turns' p50 differences; read-mcp-p50-ms,
// read-http-p50-ms, read-inproc-p50-ms; hop-ms and inproc-hop-ms, the
// medians of the turns' read p50 differences (MCP through the binary, and
// in process, less HTTP).
func BenchmarkMCPReply(b *testing.B) {
	perTurn, cycles := mcpSizes()
	bin := mcpBinary(b)
	ctx := context.Background()

	s, err := store.Open(ctx, store.Options{StorageDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	v, err := s.Principal(ctx, mcpAgent, "@"+mcpAgent+":example.org")
	if err != nil {
		b.Fatal(err)
	}
	// Every reply answers an event of its own: the unmeasured turns', then
	// b.N × cycles turns of each reply arm.
	events := (1 + b.N*cycles) * 2 * perTurn
	ids := make([]string, events)
	for start := 0; start < events; start += 500 {
		batch := make([]mx.Ev, 0, 500)
		for i := start; i < min(events, start+500); i++ {
			ids[i] = fmt.Sprintf("$mcp-%07d", i)
			batch = append(batch, mx.Message(ids[i], "@alice:example.org", int64(1_000_000+i), fmt.Sprintf("question %d", i)))
		}
		if _, err := v.AdmitBatch(ctx, mx.Live(mcpRoom, batch...), fmt.Sprintf("s_%d", start)); err != nil {
			b.Fatal(err)
		}
	}
	srv := httptest.NewServer(api.New(api.Deps{
		Agents: map[string]api.Agent{mcpAgent: {Store: v, Token: mcpToken, Hints: s.Hints()}},
		Log:    zerolog.Nop()}))
	b.Cleanup(srv.Close)
	cs := mcpSession(b, bin, srv.URL)
	local := pipeSession(b, srv.URL)

	next := 0
	fresh := func() string { next++; return ids[next-1] }
	httpReply := func() (time.Duration, error) {
		id := fresh()
		req, _ := http.NewRequest(http.MethodPost,
			srv.URL+"/v1/agents/"+mcpAgent+"/events/"+url.PathEscape(id)+"/reply",
			strings.NewReader(`{"body":"`+mcpBody+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+mcpToken)
		t0 := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("reply %s: status %d: %s", id, resp.StatusCode, body)
		}
		return d, replyCreated(id, body)
	}
	mcpReply := func() (time.Duration, error) {
		id := fresh()
		t0 := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "reply",
			Arguments: map[string]any{"event_id": id, "body": mcpBody}})
		d := time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("reply %s: %w", id, err)
		}
		body, _ := json.Marshal(res.StructuredContent)
		if res.IsError {
			return 0, fmt.Errorf("reply %s: tool error %s", id, body)
		}
		return d, replyCreated(id, body)
	}
	readURL := srv.URL + "/v1/agents/" + mcpAgent + "/rooms/" + url.PathEscape(mcpRoom) + "/messages?limit=1"
	httpRead := func() (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodGet, readURL, nil)
		req.Header.Set("Authorization", "Bearer "+mcpToken)
		t0 := time.Now()
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("read: status %d", resp.StatusCode)
		}
		return d, err
	}
	mcpRead := func(cs *mcp.ClientSession) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			t0 := time.Now()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_conversation",
				Arguments: map[string]any{"room_id": mcpRoom, "limit": 1}})
			d := time.Since(t0)
			if err == nil && res.IsError {
				body, _ := json.Marshal(res.StructuredContent)
				err = fmt.Errorf("read: tool error %s", body)
			}
			return d, err
		}
	}

	type arm struct {
		call    func() (time.Duration, error)
		all     []time.Duration
		turns   []time.Duration // each turn's p50
		elapsed time.Duration
	}
	replyHTTP, replyMCP := &arm{call: httpReply}, &arm{call: mcpReply}
	readHTTP, readMCP, readLocal := &arm{call: httpRead}, &arm{call: mcpRead(cs)}, &arm{call: mcpRead(local)}
	turn := func(a *arm, measured bool) {
		lat := make([]time.Duration, 0, perTurn)
		start := time.Now()
		for range perTurn {
			d, err := a.call()
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, d)
		}
		if !measured {
			return
		}
		a.elapsed += time.Since(start)
		a.all = append(a.all, lat...)
		a.turns = append(a.turns, percentile(lat, 50))
	}
	for _, a := range []*arm{replyHTTP, replyMCP, readHTTP, readMCP, readLocal} {
		turn(a, false)
	}
	b.ResetTimer()
	for i := range b.N * cycles {
		order := []*arm{replyHTTP, replyMCP, readHTTP, readMCP, readLocal}
		if i%2 == 1 {
			order = []*arm{replyMCP, replyHTTP, readLocal, readMCP, readHTTP}
		}
		for _, a := range order {
			turn(a, true)
		}
	}
	b.StopTimer()

	ratios := make([]float64, len(replyMCP.turns))
	diffs := make([]float64, len(replyMCP.turns))
	hops := make([]float64, len(readMCP.turns))
	localHops := make([]float64, len(readLocal.turns))
	for i := range ratios {
		ratios[i] = float64(replyMCP.turns[i]) / float64(replyHTTP.turns[i])
		diffs[i] = ms(replyMCP.turns[i] - replyHTTP.turns[i])
		hops[i] = ms(readMCP.turns[i] - readHTTP.turns[i])
		localHops[i] = ms(readLocal.turns[i] - readHTTP.turns[i])
	}
	b.ReportMetric(ms(percentile(replyMCP.all, 50)), "mcp-p50-ms")
	b.ReportMetric(ms(percentile(replyHTTP.all, 50)), "http-p50-ms")
	b.ReportMetric(ms(percentile(replyMCP.all, 99)), "mcp-p99-ms")
	b.ReportMetric(ms(percentile(replyHTTP.all, 99)), "http-p99-ms")
	b.ReportMetric(median(ratios), "mcp/http")
	b.ReportMetric(slices.Min(ratios), "ratio-min")
	b.ReportMetric(slices.Max(ratios), "ratio-max")
	b.ReportMetric(float64(len(replyMCP.all))/replyMCP.elapsed.Seconds(), "mcp-replies/s")
	b.ReportMetric(float64(len(replyHTTP.all))/replyHTTP.elapsed.Seconds(), "http-replies/s")
	b.ReportMetric(median(diffs), "reply-diff-ms")
	b.ReportMetric(ms(percentile(readMCP.all, 50)), "read-mcp-p50-ms")
	b.ReportMetric(ms(percentile(readHTTP.all, 50)), "read-http-p50-ms")
	b.ReportMetric(ms(percentile(readLocal.all, 50)), "read-inproc-p50-ms")
	b.ReportMetric(median(hops), "hop-ms")
	b.ReportMetric(median(localHops), "inproc-hop-ms")
}

// replyCreated checks that a reply's answer recorded a new delivery.
func replyCreated(id string, body []byte) error {
	var out struct {
		Outcome string `json:"outcome"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Outcome != "created" {
		return fmt.Errorf("reply %s: answer %s", id, body)
	}
	return nil
}

var (
	mcpBinOnce sync.Once
	mcpBinPath string
	mcpBinErr  error
)

// mcpBinary builds cmd/mindroomd once per test process into the bench
// cache (.cache/bench/bin); go build leaves a binary that is up to date
// alone, so later processes pay only for the check.
func mcpBinary(b *testing.B) string {
	b.Helper()
	mcpBinOnce.Do(func() {
		dir, err := cacheDir()
		if err != nil {
			mcpBinErr = err
			return
		}
		mcpBinPath = filepath.Join(dir, "bin", "mindroomd")
		cmd := exec.Command("go", "build", "-o", mcpBinPath, "github.com/mindroomd/mindroomd/cmd/mindroomd")
		if out, err := cmd.CombinedOutput(); err != nil {
			mcpBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if mcpBinErr != nil {
		b.Fatal(mcpBinErr)
	}
	return mcpBinPath
}

// mcpSession starts `mindroomd mcp` for the agent against the API at base,
// with a configuration of its own, and connects an SDK client to it over
// its stdin and stdout. Cleanup closes stdin and waits for the process.
func mcpSession(b *testing.B, bin, base string) *mcp.ClientSession {
	b.Helper()
	dir := b.TempDir()
	for file, secret := range map[string]string{"bench.password": "pw", "bench.api-token": mcpToken + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(secret), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: http://127.0.0.1:1
storage: ./storage
listen: %s
agents:
  - name: %s
    user_id: "@%s:example.org"
    password_file: bench.password
    api_token_file: bench.api-token
    backend:
      type: http
`, strings.TrimPrefix(base, "http://"), mcpAgent, mcpAgent)), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "mcp", "-config", cfg, "-agent", mcpAgent, "-api", base)
	stderr := &logbuf.Buffer{}
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "v0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		b.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	b.Cleanup(func() {
		if err := cs.Close(); err != nil {
			b.Errorf("close: %v\n%s", err, stderr.String())
		}
	})
	return cs
}

// pipeSession serves the agent's tools with mcpserver.New inside this
// process over a pair of pipes, the transport `mindroomd mcp` uses on its
// stdin and stdout, and connects an SDK client to it.
func pipeSession(b *testing.B, base string) *mcp.ClientSession {
	b.Helper()
	ctx := context.Background()
	toServer, fromClient, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	toClient, fromServer, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	srv := mcpserver.New(mcpserver.Options{Agent: mcpAgent, API: base, Token: mcpToken})
	ss, err := srv.Connect(ctx, &mcp.IOTransport{Reader: toServer, Writer: fromServer}, nil)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "v0"}, nil).
		Connect(ctx, &mcp.IOTransport{Reader: toClient, Writer: fromClient}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Close()
	})
	return cs
}
