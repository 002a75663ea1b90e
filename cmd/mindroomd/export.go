package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
)

// envAPIToken names the environment variable export reads the agent's API
// token from when no -token-file is given.
const envAPIToken = "MINDROOM_API_TOKEN"

// The export formats, as the API's export route names them.
const (
	formatJSONLines = "jsonl"
	formatMarkdown  = "markdown"
)

// maxErrorBody bounds how much of a refusal's body export reads: the API's
// errors are one short JSON object.
const maxErrorBody = 64 << 10

// Errors of export.
var (
	// errUnreachable reports a daemon export could not connect to.
	errUnreachable = errors.New("cannot reach the daemon's agent API")
	// errCutShort reports an export whose body ended before it was whole:
	// the daemon cuts the connection when a read fails midway, so the
	// output already written is incomplete.
	errCutShort = errors.New("export cut short; the output is incomplete")
	// errNoPrincipal reports an agent the journal holds nothing for.
	errNoPrincipal = errors.New("the journal has no principal for this agent")
)

// apiError is a refusal from the agent API, as its JSON error body spells
// it.
type apiError struct {
	Status  int
	Code    string
	Message string
}

// Error implements error.
func (e *apiError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("the daemon answered %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("the daemon answered %d %s: %s", e.Status, e.Code, e.Message)
}

// exportOptions are the flags of export.
type exportOptions struct {
	agent     string
	room      string
	thread    string
	format    string
	api       string
	tokenFile string
	offline   bool
}

// check refuses a command line export cannot run, before anything is read.
func (o exportOptions) check() error {
	switch {
	case o.room == "":
		return errors.New("-room is required")
	case !journal.ValidRoomID(o.room):
		return fmt.Errorf("-room %q is not a room ID (!opaque:server)", o.room)
	case o.thread != "" && !journal.ValidEventID(o.thread):
		return fmt.Errorf("-thread %q is not an event ID ($opaque)", o.thread)
	case o.format != formatJSONLines && o.format != formatMarkdown:
		return fmt.Errorf("-format must be %s or %s", formatJSONLines, formatMarkdown)
	case o.offline && (o.api != "" || o.tokenFile != ""):
		return errors.New("-offline reads the journal itself; -api and -token-file are for the daemon's API")
	}
	if o.api != "" {
		if _, err := apiURL(o.api); err != nil {
			return err
		}
	}
	return nil
}

// threadOf is the -thread flag as the journal takes it: nil for the room.
func (o exportOptions) threadOf() *string {
	if o.thread == "" {
		return nil
	}
	return &o.thread
}

// runExport writes one conversation to out, oldest message first, in the
// API's export format: through the running daemon's agent API, or with
// offline from the journal itself, read-only. Progress goes to errOut
// when it is a terminal.
func runExport(ctx context.Context, out, errOut io.Writer, cfg *config.Config, o exportOptions) error {
	a, err := exportAgent(cfg, o.agent)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(out)
	if o.offline {
		err = exportOffline(ctx, bw, terminal(errOut), journalReader(journalOptions(cfg)), a.Principal(), o.room, o.threadOf(), o.format,
			journal.DefaultExportPage)
	} else {
		err = exportFromDaemon(ctx, bw, terminal(errOut), cfg, a, o)
	}
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// exportAgent is the configured agent named name, or the only one when
// name is empty.
func exportAgent(cfg *config.Config, name string) (config.Agent, error) {
	names := make([]string, 0, len(cfg.Agents))
	for _, a := range cfg.Agents {
		if a.Name == name || (name == "" && len(cfg.Agents) == 1) {
			return a, nil
		}
		names = append(names, a.Name)
	}
	if name == "" {
		return config.Agent{}, &usageError{command: "export",
			err: fmt.Errorf("-agent is required: the configuration has %d agents (%s)", len(names), strings.Join(names, ", "))}
	}
	return config.Agent{}, &usageError{command: "export",
		err: fmt.Errorf("no agent %q in the configuration (it has %s)", name, strings.Join(names, ", "))}
}

// exportFromDaemon asks the daemon's export route for the conversation
// and copies the answer to out as it comes.
func exportFromDaemon(ctx context.Context, out io.Writer, term io.Writer, cfg *config.Config, a config.Agent, o exportOptions) error {
	base := o.api
	if base == "" {
		var err error
		if base, err = listenURL(cfg.Listen); err != nil {
			return err
		}
	}
	u, err := apiURL(base)
	if err != nil {
		return err
	}
	token, err := apiToken(o.tokenFile, a)
	if err != nil {
		return err
	}
	q := url.Values{"format": {o.format}}
	if o.thread != "" {
		q.Set("thread", o.thread)
	}
	// Escaped segment by segment: a room ID may hold a slash.
	target := strings.TrimSuffix(u.String(), "/") + "/v1/agents/" + url.PathEscape(a.Name) +
		"/rooms/" + url.PathEscape(o.room) + "/export?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("export request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	bar := newSpinner(term, "export", true)
	defer bar.done()
	// No timeout but ctx: the daemon reads the whole conversation once
	// before it answers, which takes as long as the conversation is long.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w at %s (is it running? -offline reads the journal without it): %w", errUnreachable, u.Redacted(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refusal(resp)
	}
	dst := &sink{w: out}
	if _, err := io.Copy(io.MultiWriter(dst, bar), resp.Body); err != nil {
		switch {
		case dst.err != nil:
			return fmt.Errorf("write export: %w", dst.err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", errCutShort, err)
	}
	return nil
}

// sink keeps the first error of the writer it wraps, so a failed write of
// the output is told apart from a body the daemon cut short.
type sink struct {
	w   io.Writer
	err error
}

// Write implements io.Writer.
func (s *sink) Write(b []byte) (int, error) {
	n, err := s.w.Write(b)
	if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

// refusal reads the API's JSON error from a response that is not 200.
func refusal(resp *http.Response) error {
	e := &apiError{Status: resp.StatusCode}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&body) == nil {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	}
	return e
}

// listenURL is the agent API's base URL for the daemon's listen address:
// a wildcard host is reached on loopback, and a port chosen at start
// cannot be known here.
func listenURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen %q: %w", listen, err)
	}
	if port == "0" {
		return "", &usageError{command: "export",
			err: errors.New("the configured listen port is 0, chosen when the daemon starts; give -api with the address it logged")}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// apiURL checks an agent API base URL given on the command line.
func apiURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		// The parser's message quotes the URL whole, password and all.
		return nil, errors.New("-api is not an http(s) base URL such as http://127.0.0.1:8787")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("-api %q is not an http(s) base URL such as http://127.0.0.1:8787", u.Redacted())
	}
	return u, nil
}

// apiToken reads the agent's API token: from tokenFile when it is given,
// else from $MINDROOM_API_TOKEN, else the agent's api_token_file. It is a
// secret: no error carries it.
func apiToken(tokenFile string, a config.Agent) (string, error) {
	if tokenFile != "" {
		data, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", fmt.Errorf("read -token-file: %w", err)
		}
		s := string(data)
		if t, ok := strings.CutSuffix(s, "\r\n"); ok {
			s = t
		} else {
			s = strings.TrimSuffix(s, "\n")
		}
		if s == "" {
			return "", fmt.Errorf("-token-file %s is empty", tokenFile)
		}
		return s, nil
	}
	if v := os.Getenv(envAPIToken); v != "" {
		return v, nil
	}
	if a.APIToken.IsSet() {
		return a.APIToken.Reveal(), nil
	}
	return "", &usageError{command: "export", err: fmt.Errorf(
		"no API token for agent %s: give -token-file, set %s, or configure the agent's api_token_file (or use -offline)",
		a.Name, envAPIToken)}
}

// openReader opens a journal read-only and returns principal's reader of
// it, and how to close it.
type openReader func(ctx context.Context, principal journal.Principal) (journal.ConversationReader, func(), error)

// journalReader reads the journal journalAt names, read-only.
func journalReader(journalAt store.Options) openReader {
	journalAt.ReadOnly, journalAt.Readers, journalAt.MaxConns = true, 1, 2
	return func(ctx context.Context, principal journal.Principal) (journal.ConversationReader, func(), error) {
		s, err := store.Open(ctx, journalAt)
		if err != nil {
			return nil, nil, err
		}
		v, err := s.Principal(ctx, principal.Agent, principal.UserID)
		if errors.Is(err, store.ErrUnknownPrincipal) {
			err = fmt.Errorf("%w: %s (%s)", errNoPrincipal, principal.Agent, principal.UserID)
		}
		if err != nil {
			_ = s.Close()
			return nil, nil, err
		}
		return v, func() { _ = s.Close() }, nil
	}
}

// exportOffline writes the conversation from the journal open opens
// read-only, byte for byte as the API's export route writes it
// (api/export.go): the same two walks over pages of pageSize, the same
// lines. It runs beside a daemon or without one.
func exportOffline(ctx context.Context, out io.Writer, term io.Writer, open openReader, principal journal.Principal,
	room string, thread *string, format string, pageSize int) error {
	write, _, err := api.ExportFormat(format)
	if err != nil {
		return err
	}
	r, closeReader, err := open(ctx, principal)
	if err != nil {
		return err
	}
	defer closeReader()

	// Pages come newest first; the plan keeps the newest page and the
	// cursor of every older one, and the pages are written oldest first,
	// exactly as the daemon's export route writes them.
	reading := newSpinner(term, "export: reading pages", false)
	plan, err := journal.PlanExport(ctx, r, room, thread, pageSize, func() { reading.add(1) })
	reading.done()
	if err != nil {
		return err
	}
	writing := newBar(term, int64(plan.Len()), "export: writing pages")
	defer writing.done()
	for page, err := range plan.Pages(ctx, r, room, thread, pageSize) {
		if err != nil {
			return fmt.Errorf("%w: %w", errCutShort, err)
		}
		if err := write(out, page); err != nil {
			return err
		}
		writing.add(1)
	}
	return nil
}

// terminal returns w when it is a terminal, where progress belongs, and
// nil otherwise: a pipe or a file gets no progress.
func terminal(w io.Writer) io.Writer {
	f, ok := w.(*os.File)
	if !ok || !(isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		return nil
	}
	return f
}

// progress is a progress bar on a terminal; a nil one shows nothing.
type progress struct{ bar *progressbar.ProgressBar }

// progressOptions are what every bar shares: drawn at once, cleared when
// done, so an error or the next bar starts on a clean line.
func progressOptions(term io.Writer, description string) []progressbar.Option {
	return []progressbar.Option{
		progressbar.OptionSetWriter(term),
		progressbar.OptionSetDescription(description),
		progressbar.OptionThrottle(65 * time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
	}
}

// newSpinner shows work of unknown length on term: bytes when bytes is
// set, a count otherwise. A nil term shows nothing.
func newSpinner(term io.Writer, description string, bytes bool) *progress {
	if term == nil {
		return nil
	}
	opts := append(progressOptions(term, description), progressbar.OptionSpinnerType(14))
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true))
	}
	return &progress{bar: progressbar.NewOptions64(-1, opts...)}
}

// newBar shows work of max steps on term; a nil term shows nothing.
func newBar(term io.Writer, max int64, description string) *progress {
	if term == nil {
		return nil
	}
	return &progress{bar: progressbar.NewOptions64(max, progressOptions(term, description)...)}
}

// add counts n steps done. Progress is shown as best it can be: a
// terminal that fails to draw it does not fail the export.
func (p *progress) add(n int) {
	if p != nil {
		_ = p.bar.Add(n)
	}
}

// Write counts the bytes written, for io.MultiWriter; it never fails, so
// the export's own writer is the only one whose errors count.
func (p *progress) Write(b []byte) (int, error) {
	p.add(len(b))
	return len(b), nil
}

// done clears the bar and stops its spinner.
func (p *progress) done() {
	if p != nil {
		_ = p.bar.Finish()
	}
}
