package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/metrics"
	"github.com/mindroomd/mindroomd/receipts"
	"github.com/mindroomd/mindroomd/retention"
	"github.com/mindroomd/mindroomd/store"
)

// leaveTimeout bounds a leave asked through the API: the fence's
// transaction and one request to the homeserver.
const leaveTimeout = time.Minute

// daemon is what run started, stopped in the reverse order.
type daemon struct {
	log    zerolog.Logger
	store  *store.Store
	system *actor.ActorSystem
	// runs are the agents this daemon serves, in start order; they stop
	// in reverse. A replica of several keeps its own in replicas instead.
	runs      []*agentRun
	replicas  *replicaSet
	apiAgents map[string]api.Agent
	metrics   *metrics.Metrics
	server    *http.Server
	faults    chan error
	// crypto is the agents' crypto store; it closes after the principals
	// stop.
	crypto    *e2ee.Store
	pickleKey []byte
	// background runs each agent's read receipts until the principals
	// have stopped.
	background     sync.WaitGroup
	bg             context.Context
	stopBackground context.CancelFunc
	mediaMax       int64
	// mu guards agentHooks, each agent's metrics hooks.
	mu         sync.Mutex
	agentHooks map[string]agentHooks
}

// runDaemon runs the agents cfgPath configures until ctx ends or a fault
// stops the journal or an agent, then shuts down in order: the principals
// (their sync loops, workers, fences and outboxes) first, the writer last,
// after it committed everything already accepted.
func runDaemon(ctx context.Context, stderr io.Writer, cfg *config.Config) (err error) {
	log := zerolog.New(stderr).With().Timestamp().Logger()
	// Every back-end is checked before anything opens or signs in.
	answers := make([]agent.Agent, len(cfg.Agents))
	clients := make([]*clientRef, len(cfg.Agents))
	for i, a := range cfg.Agents {
		clients[i] = new(clientRef)
		if answers[i], err = backend(i, a, cfg.MediaMaxBytes, clients[i], log.With().Str("agent", a.Name).Logger()); err != nil {
			return err
		}
	}
	d := &daemon{log: log, faults: make(chan error, 1), apiAgents: make(map[string]api.Agent),
		mediaMax: cfg.MediaMaxBytes, agentHooks: make(map[string]agentHooks)}
	d.bg, d.stopBackground = context.WithCancel(context.Background())
	defer func() {
		// Close reports the writer's fault again; run already ends with it.
		if serr := d.stop(); serr != nil && !errors.Is(err, serr) {
			err = errors.Join(err, serr)
		}
	}()
	d.metrics = metrics.New(func(ctx context.Context) ([]journal.Backlog, error) { return d.store.Backlogs(ctx) }, nil)
	js, err := d.openJournal(ctx, cfg)
	if err != nil {
		return err
	}
	d.store = js
	if err := d.openCrypto(ctx, cfg); err != nil {
		return err
	}
	d.system = actors.NewSystem(d.log)
	var active func(string) bool
	if cfg.Replicas == config.ReplicasAuto {
		// The agents start as this replica takes their leases; the API
		// knows every agent's token from the start.
		if d.replicas, err = newReplicaSet(ctx, d, cfg, answers, clients); err != nil {
			return err
		}
		for _, a := range cfg.Agents {
			d.apiAgents[a.Name] = api.Agent{Token: a.APIToken.Reveal()}
		}
		active = d.replicas.serves
	}
	for i, a := range cfg.Agents {
		if d.replicas != nil {
			break
		}
		run, err := d.startAgent(ctx, cfg, a, answers[i], clients[i], func(err error) { d.fault(fmt.Errorf("agent %s: %w", a.Name, err)) })
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				// A signal while waiting for the homeserver.
				d.log.Info().Msg("Shutting down")
				return nil
			}
			return fmt.Errorf("agents[%d] %s: %w", i, a.Name, err)
		}
		d.runs = append(d.runs, run)
		d.apiAgents[a.Name] = run.api
	}
	targets, err := d.retentionTargets(ctx, cfg, active)
	if err != nil {
		return err
	}
	d.background.Go(func() {
		retention.Run(d.bg, retention.Deps{Targets: targets, Log: d.log.With().Str("component", "retention").Logger(),
			OnPass: d.metrics.Retained, Reclaim: func(ctx context.Context) (int64, error) {
				n, err := d.store.Reclaim(ctx)
				d.metrics.Reclaimed(n)
				return n, err
			}})
	})
	addr, err := d.serve(cfg.Listen)
	if err != nil {
		return err
	}
	if d.replicas != nil {
		if err := d.replicas.start(addr); err != nil {
			return err
		}
	}
	d.log.Info().Int("agents", len(cfg.Agents)).Str("storage", cfg.Storage).Str("journal", d.store.Kind()).
		Str("listen", addr).Msg("mindroomd running")
	select {
	case <-ctx.Done():
		d.log.Info().Msg("Shutting down")
		return nil
	case <-d.store.Done():
		return fmt.Errorf("journal writer stopped: %w", d.store.Fatal())
	case err := <-d.faults:
		return err
	}
}

// openJournal opens the journal cfg selects: PostgreSQL when a database
// URL is configured, the SQLite file under storage otherwise.
func (d *daemon) openJournal(ctx context.Context, cfg *config.Config) (*store.Store, error) {
	opts := journalOptions(cfg)
	if cfg.Replicas == config.ReplicasAuto {
		opts.Replica, opts.Takeover, opts.LeaseCheck = replicaID(cfg), cfg.ReplicaTakeover, cfg.ReplicaLeaseCheck
	}
	opts.Log, opts.OnCommit, opts.OnBusy = d.log, d.metrics.Committed, d.metrics.Busy
	return store.Open(ctx, opts)
}

// openCrypto opens the agents' crypto store, in the journal's PostgreSQL
// database or in its own file beside the SQLite journal, and reads (or on
// the first start generates) the pickle key.
func (d *daemon) openCrypto(ctx context.Context, cfg *config.Config) (err error) {
	if d.pickleKey, err = e2ee.LoadPickleKey(cfg.PickleKeyFile); err != nil {
		return err
	}
	if url := cfg.DatabaseURL.Reveal(); url != "" {
		replica := ""
		if cfg.Replicas == config.ReplicasAuto {
			replica = replicaID(cfg)
		}
		d.crypto, err = e2ee.OpenPostgres(ctx, url, replica)
	} else {
		d.crypto, err = e2ee.OpenSQLite(ctx, filepath.Join(cfg.Storage, e2ee.FileName))
	}
	return err
}

// crossSign has the agent's device signed by its account's self-signing
// key, bootstrapping cross-signing with the password on the first start,
// and records the device's standing for `mindroomd status`. A device that
// stays unsigned is no failure (the agent still reads and answers), but
// the log says what it needs.
func crossSign(ctx context.Context, storage string, a config.Agent, m *e2ee.Machine, log zerolog.Logger) error {
	st, err := m.CrossSign(ctx, e2ee.CrossSignOptions{RecoveryKeyFile: a.RecoveryKeyFile, Password: a.Password.Reveal()})
	if err != nil {
		return fmt.Errorf("cross-signing: %w", err)
	}
	rec := log.Info()
	if !st.CrossSigned {
		rec = log.Warn().Str("reason", st.Reason)
	}
	rec.Str("device_id", m.DeviceID()).Bool("cross_signed", st.CrossSigned).Bool("bootstrapped", st.Bootstrapped).
		Msg("End-to-end encryption ready")
	return e2ee.WriteDeviceStatus(storage, a.Name, e2ee.DeviceStatus{DeviceID: m.DeviceID(), CrossSigned: st.CrossSigned,
		Reason: st.Reason, CheckedMS: time.Now().UnixMilli()})
}

// backend is the Agent the i-th agent's back-end answers with, logging to
// log: none for http, where an outside agent takes the work through the
// agent API. It opens no connection: a model server may start after the
// daemon.
func backend(i int, a config.Agent, mediaMax int64, client *clientRef, log zerolog.Logger) (agent.Agent, error) {
	// The config validated the back-end's keys and left the ones left out
	// zero: each back-end gives them its defaults.
	switch a.Backend.Type {
	case config.BackendEcho:
		return agent.Echo{}, nil
	case config.BackendHTTP:
		return nil, nil
	case config.BackendExec:
		return agent.Exec{Command: a.Backend.Exec.Command, Timeout: a.Backend.Exec.Timeout, Env: a.Backend.Exec.Env, Log: log}, nil
	case config.BackendOpenAI:
		o := a.Backend.OpenAI
		return agent.NewOpenAI(agent.OpenAIOptions{BaseURL: o.BaseURL, Model: o.Model, APIKey: o.APIKey.Reveal(),
			SystemPrompt: o.SystemPrompt, ContextMessages: o.ContextMessages, Stream: o.Stream, UserID: a.UserID, Log: log,
			Vision: o.Vision, MaxImageBytes: mediaMax, FetchMedia: client.fetchMedia, Tools: tools(a.Backend.Tools)}), nil
	}
	return nil, &config.Error{Field: fmt.Sprintf("agents[%d].backend.type", i),
		Err: fmt.Errorf("%q is not a back-end this build runs", a.Backend.Type)}
}

// tools are an openai back-end's configured tools.
func tools(cfg []config.Tool) []agent.Tool {
	var out []agent.Tool
	for _, t := range cfg {
		out = append(out, agent.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Command: t.Command,
			Env: t.Env, Timeout: t.Timeout, Approval: t.NeedsApproval(), Approvers: t.Approvers, ExpiresIn: t.ExpiresIn,
			Secret: t.Secret})
	}
	return out
}

// placeholderOf is the placeholder an agent sends before each answer
// (principal.Deps.Placeholder), when it has one: a streamed answer is shown
// by editing it.
func placeholderOf(answer agent.Agent) json.RawMessage {
	if p, ok := answer.(interface{ Placeholder() json.RawMessage }); ok {
		return p.Placeholder()
	}
	return nil
}

// agentRun is one agent as this daemon serves it: what startAgent
// started, stopped by stop in the reverse order.
type agentRun struct {
	name string
	// api is the agent as the agent API serves it.
	api api.Agent
	// actors are its hydrator and principal, in start order.
	actors  []*actor.PID
	machine *e2ee.Machine
	// stopMarks ends its read receipts, marks their loop.
	stopMarks context.CancelFunc
	marks     sync.WaitGroup
}

// agentHooks are one agent's metrics hooks: registered once, whatever
// number of times a replica comes to serve the agent.
type agentHooks struct {
	onSynced   func([]journal.AdmitResult)
	onDelivery func(string)
	walked     func(metrics.Walk)
}

// hooks are the metrics hooks of the agent named name.
func (d *daemon) hooks(name string) agentHooks {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.agentHooks[name]; ok {
		return h
	}
	var h agentHooks
	h.onSynced, h.onDelivery = d.metrics.Agent(name)
	h.walked = d.metrics.Hydration(name)
	d.agentHooks[name] = h
	return h
}

// retentionTargets are the agents whose settled data is pruned, and their
// policies.
func (d *daemon) retentionTargets(ctx context.Context, cfg *config.Config, active func(string) bool) ([]retention.Target, error) {
	var out []retention.Target
	for _, a := range cfg.Agents {
		r := cfg.RetentionOf(a)
		if r == nil {
			continue
		}
		plain, err := d.store.Principal(ctx, a.Name, a.UserID)
		if err != nil {
			return nil, err
		}
		interval := r.Interval
		if interval <= 0 {
			interval = config.DefaultRetentionInterval
		}
		t := retention.Target{Agent: a.Name, Store: plain, Policy: r.Policy(), Interval: interval}
		if active != nil {
			name := a.Name
			t.Active = func() bool { return active(name) }
		}
		out = append(out, t)
	}
	return out, nil
}

// startAgent signs one agent in and starts its principal. onFault learns
// of a fault that stopped the agent.
func (d *daemon) startAgent(ctx context.Context, cfg *config.Config, a config.Agent, answer agent.Agent, ref *clientRef,
	onFault func(error)) (_ *agentRun, err error) {
	plain, err := d.store.Principal(ctx, a.Name, a.UserID)
	if err != nil {
		return nil, err
	}
	log := d.log.With().Str("agent", a.Name).Logger()
	client, err := login(ctx, matrix.Config{Homeserver: cfg.Homeserver, UserID: a.UserID,
		Password: a.Password.Reveal(), AccessToken: a.AccessToken.Reveal(), Agent: a.Name, StorageDir: cfg.Storage,
		Sessions: sessionsOf(d.store, cfg.Storage), Log: log}, log)
	if err != nil {
		return nil, err
	}
	ref.c.Store(client)
	machine, err := d.crypto.Machine(ctx, e2ee.Options{Account: plain.Principal().String(), Client: client,
		PickleKey: d.pickleKey, Log: log, Observe: d.metrics.Decryption(a.Name)})
	if err != nil {
		return nil, err
	}
	run := &agentRun{name: a.Name, machine: machine}
	defer func() {
		if err != nil {
			d.stopAgent(run)
		}
	}()
	client.SetEncrypter(machine)
	// Everything that settles the agent's events, its turns and the agent
	// API alike, goes through the view that marks rooms read.
	marks := receipts.New(receipts.Deps{Sender: client, Mode: receiptMode(a), Log: log.With().Str("component", "receipts").Logger()})
	view := receipts.Wrap(plain, marks)
	var marksCtx context.Context
	marksCtx, run.stopMarks = context.WithCancel(d.bg)
	run.marks.Go(func() { marks.Run(marksCtx) })
	if err := crossSign(ctx, cfg.Storage, a, machine, log); err != nil {
		return nil, err
	}
	hooks := d.hooks(a.Name)
	hyd := d.system.Root.Spawn(hydrator.Props(hydrator.Deps{Store: view, Transport: client, Decrypt: machine.Decrypt,
		Log: log.With().Str("actor", "hydrator").Logger(), Finished: func(w hydrator.Walk, err error) {
			hooks.walked(metrics.Walk{Kind: w.Kind, Requests: w.Requests, Events: w.Events, Chunks: w.Chunks,
				Covered: w.Covered, Failed: err != nil})
		}}))
	run.actors = append(run.actors, hyd)
	reconciler := matrix.NewReconciler(client)
	reconciler.Open = machine.Open
	conversation := &hydrator.Reader{Store: view, Root: d.system.Root, Hydrator: hyd, Log: log}
	pid := d.system.Root.Spawn(principal.Props(principal.Deps{
		OnSynced: hooks.onSynced, OnDelivery: func(p outbox.Point) { hooks.onDelivery(string(p)) },
		Store: view, Conversation: conversation, Transport: client, Agent: answer, Placeholder: placeholderOf(answer),
		Sender: matrix.NewSender(client), Reconciler: reconciler, DeviceID: client.DeviceID(),
		Hints: d.store.Hints(), AutoJoin: a.AutoJoin, Log: d.log.With().Str("agent", a.Name).Logger(),
		Crypto: machine, KeyDeadline: cfg.KeyDeadline, KeyNoticeAfter: keyNoticeAfter(cfg),
		MaxUpload: cfg.MediaMaxBytes, TypingRenew: typingRenew(a), ApprovalKeys: approvalKeys(a),
		OnFault: onFault,
	}))
	run.actors = append(run.actors, pid)
	run.api = api.Agent{Store: view, Conversation: conversation, Token: a.APIToken.Reveal(), Hints: d.store.Hints(),
		Homeserver: homeserver{client}, ApprovalKeys: approvalKeys(a), Leave: func(ctx context.Context, room string) error {
			res, err := d.system.Root.RequestFuture(pid, &principal.Leave{RoomID: room}, leaveTimeout).Result()
			if err != nil {
				return err
			}
			return res.(*principal.Left).Err
		}}
	return run, nil
}

// stopAgent stops what startAgent started, in reverse: the principal
// (its sync loop, workers, fences and outbox) and the hydrator, then the
// read receipts, the olm machine last.
func (d *daemon) stopAgent(run *agentRun) {
	for i := len(run.actors) - 1; i >= 0; i-- {
		if err := d.system.Root.StopFuture(run.actors[i]).Wait(); err != nil {
			d.log.Warn().Err(err).Str("agent", run.name).Msg("Stopping an agent's actor failed")
		}
	}
	if run.stopMarks != nil {
		run.stopMarks()
		run.marks.Wait()
	}
	run.machine.Close()
}

// The backoff of the login at start. The homeserver may start after the
// daemon (both started at boot), or be restarting; the wait is capped lower
// than the sync loop's, since nothing runs until the login succeeds.
const (
	loginRetryBase = time.Second
	loginRetryMax  = time.Minute
)

// login signs an account in, and while the homeserver cannot be reached or
// answers 5xx or 429, tries again with exponential backoff and jitter (or
// as long as a 429 asks) until ctx ends. A refusal (a wrong password, a
// refused token, another user's credentials) ends it at once: trying again
// cannot mend it.
func login(ctx context.Context, cfg matrix.Config, log zerolog.Logger) (*matrix.Client, error) {
	for failures := 1; ; failures++ {
		client, err := matrix.Login(ctx, cfg)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return client, err
		}
		delay := loginRetryBase << min(failures-1, 16)
		if delay > loginRetryMax {
			delay = loginRetryMax
		}
		delay = delay/2 + rand.N(delay/2+1)
		if he := (*matrix.HTTPError)(nil); errors.As(err, &he) && he.RetryAfter > delay {
			delay = min(he.RetryAfter, loginRetryMax)
		}
		log.Warn().Err(err).Int("failures", failures).Dur("retry_in", delay).Msg("Homeserver unavailable at start; retrying the login")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// transient reports a failed request that may pass by itself: one the
// homeserver never answered (a refused connection, a timeout), or answered
// with 5xx or 429.
func transient(err error) bool {
	if he := (*matrix.HTTPError)(nil); errors.As(err, &he) {
		return he.Status >= 500 || he.Status == http.StatusTooManyRequests
	}
	var ue *url.Error
	return errors.As(err, &ue)
}

// serve starts the agent API and the metrics on listen, and returns the
// address it listens on. Long-polls, streams and exports hold a response
// open for minutes, so only reading the request is bounded.
func (d *daemon) serve(listen string) (string, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return "", fmt.Errorf("listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsAccess(l.Addr(), d.metrics.Handler()))
	deps := api.Deps{Agents: d.apiAgents, Log: d.log.With().Str("component", "api").Logger(), MaxMedia: d.mediaMax}
	if d.replicas != nil {
		deps.Serving = func(name string) (api.Agent, bool) {
			s, ok := d.replicas.agent(name)
			if !ok {
				return api.Agent{}, false
			}
			return s.run.api, true
		}
		deps.Elsewhere = d.replicas
	}
	agentAPI := api.New(deps)
	// MCP over streamable HTTP calls the same API in memory, with each
	// request's own bearer token.
	mux.Handle("/v1/agents/{agent}/mcp", mcpserver.Handler(agentAPI, slices.Sorted(maps.Keys(d.apiAgents)),
		d.log.With().Str("component", "mcp").Logger()))
	mux.Handle("/", agentAPI)
	d.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := d.server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.fault(fmt.Errorf("agent API: %w", err))
		}
	}()
	return l.Addr().String(), nil
}

// metricsAccess serves the metrics openly on a loopback address; on any
// other, only to a request bearing one of the agents' API tokens.
func (d *daemon) metricsAccess(addr net.Addr, h http.Handler) http.Handler {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		for _, a := range d.apiAgents {
			if ok && a.Token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) == 1 {
				h.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"metrics off loopback need an agent's bearer token"}}`))
	})
}

// stop shuts down what started, in reverse: intake (the agent API) first,
// then the principals, the journal last.
func (d *daemon) stop() error {
	if d.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Open long-polls and streams end with the deadline.
		if err := d.server.Shutdown(ctx); err != nil {
			_ = d.server.Close()
		}
		cancel()
	}
	if d.replicas != nil {
		d.replicas.stop()
	}
	for i := len(d.runs) - 1; i >= 0; i-- {
		d.stopAgent(d.runs[i])
	}
	if d.stopBackground != nil {
		d.stopBackground()
		d.background.Wait()
	}
	var err error
	if d.store != nil {
		// The writer's own fault comes back here as it ended the run: one
		// error, so the caller can tell it is the same and say it once.
		err = d.store.Close()
	}
	if d.crypto != nil {
		if cerr := d.crypto.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}
	return err
}

// fault ends the run with err, unless a fault already does.
func (d *daemon) fault(err error) {
	select {
	case d.faults <- err:
	default:
	}
}

// keyNoticeAfter is principal.Deps.KeyNoticeAfter: 0, telling nothing,
// when the configuration turned the notice off.
func keyNoticeAfter(cfg *config.Config) time.Duration {
	if !*cfg.KeyNotice {
		return 0
	}
	return cfg.KeyNoticeAfter
}
