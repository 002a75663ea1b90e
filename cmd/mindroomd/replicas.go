package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/pgfs"
)

// Replicas: with `replicas: auto` several daemons share one PostgreSQL
// journal and divide the agents between them. Each beats in the replicas
// table; each round it takes free agents' leases up to its fair share (the
// agents over the live replicas, rounded up) and hands back what it holds
// past it, so a replica that joins gets work and one that leaves or dies
// has its agents taken over. An agent is served only while its lease is
// held: losing it (the lease's connection failed, or another replica's
// generation refused a write) stops the agent at once.
const (
	// startTimeout bounds signing an agent in after its lease was taken;
	// the lease goes back when it runs out (the homeserver is down).
	startTimeout = time.Minute
	// forwardedHeader marks a request one replica forwarded to another,
	// which answers it or refuses it but never forwards it again.
	forwardedHeader = "X-Mindroomd-Forwarded-By"
)

// replicaSet is this daemon as one replica of several.
type replicaSet struct {
	d      *daemon
	cfg    *config.Config
	pg     *pgfs.Store
	log    zerolog.Logger
	agents []replicaAgent
	url    string

	// mu guards serving, which the agent API reads.
	mu      sync.RWMutex
	serving map[string]*servedAgent

	lost chan *pgfs.Lease
	// cooling holds, by agent, until when this replica leaves alone an
	// agent whose lease it lost: the others, whose connections held, take
	// it first.
	cooling  map[string]time.Time
	taken    atomic.Int64
	stopLoop context.CancelFunc
	loop     sync.WaitGroup
}

// replicaAgent is one configured agent, which any replica may come to serve.
type replicaAgent struct {
	cfg       config.Agent
	principal int64
	answer    agent.Agent
	ref       *clientRef
}

// servedAgent is an agent this replica serves, and the lease it serves it
// under.
type servedAgent struct {
	lease *pgfs.Lease
	run   *agentRun
}

// newReplicaSet registers every configured agent's principal; it serves
// none yet.
func newReplicaSet(ctx context.Context, d *daemon, cfg *config.Config, answers []agent.Agent, refs []*clientRef) (*replicaSet, error) {
	r := &replicaSet{d: d, cfg: cfg, pg: d.store.Postgres(), log: d.log.With().Str("component", "replicas").Logger(),
		serving: make(map[string]*servedAgent), cooling: make(map[string]time.Time), lost: make(chan *pgfs.Lease, len(cfg.Agents))}
	for i, a := range cfg.Agents {
		id, err := d.store.PrincipalID(ctx, a.Name, a.UserID)
		if err != nil {
			return nil, err
		}
		r.agents = append(r.agents, replicaAgent{cfg: a, principal: id, answer: answers[i], ref: refs[i]})
	}
	d.metrics.Replica(r.held, r.taken.Load, r.pg.FencedWrites)
	return r, nil
}

// replicaID is the name this replica goes by: the configured one, else
// the host's name and the process's.
func replicaID(cfg *config.Config) string {
	if cfg.ReplicaID != "" {
		return cfg.ReplicaID
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "mindroomd"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// advertised is where the other replicas reach this one's agent API: the
// configured URL, else the address it listens on, named by the host when
// it listens on every interface.
func advertised(cfg *config.Config, addr string) string {
	if cfg.ReplicaURL != "" {
		return cfg.ReplicaURL
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			if name, herr := os.Hostname(); herr == nil && name != "" {
				host = name
			}
		}
		addr = net.JoinHostPort(host, port)
	}
	return "http://" + addr
}

// start beats and takes this replica's share of the agents, then keeps at
// it until stop. A replica named as one already running is refused.
func (r *replicaSet) start(apiAddr string) error {
	r.url = advertised(r.cfg, apiAddr)
	if err := r.pg.Beat(context.Background(), r.url); errors.Is(err, pgfs.ErrReplicaRunning) {
		return &config.Error{Field: "replica_id", Err: err}
	} else if err != nil {
		r.log.Warn().Err(err).Msg("The first heartbeat failed; the next will try again")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopLoop = cancel
	wake := r.d.store.Hints().Subscribe(pgfs.LeaseTopic)
	r.log.Info().Str("replica", r.pg.ReplicaID()).Str("api_url", r.url).Dur("takeover", r.pg.Takeover()).
		Msg("Serving as one replica of several")
	// The beat has a loop of its own: a round that signs several agents
	// in takes longer than the server leaves the presence session idle.
	r.loop.Go(func() {
		tick := time.NewTicker(r.pg.Takeover() / 5)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := r.pg.Beat(ctx, r.url); err != nil {
				r.warn(ctx, err, "The heartbeat failed")
			}
		}
	})
	r.loop.Go(func() {
		defer wake.Close()
		tick := time.NewTicker(r.pg.Takeover() / 5)
		defer tick.Stop()
		for {
			r.round(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-wake.C():
			case l := <-r.lost:
				r.drop(l)
			}
		}
	})
	return nil
}

// held is how many agents this replica serves.
func (r *replicaSet) held() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.serving)
}

// agent is the agent named name as this replica serves it.
func (r *replicaSet) agent(name string) (*servedAgent, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.serving[name]
	return s, ok
}

// serves reports whether this replica serves the agent named name.
func (r *replicaSet) serves(name string) bool {
	_, ok := r.agent(name)
	return ok
}

// round brings what this replica serves to its fair share. A replica
// counts as live while it beats, unless an agent's row names it
// the holder while the agent's lease is free: that replica died, or lost
// its connection, and its agents are orphans the live take over at once,
// without waiting for its heartbeat to go stale.
func (r *replicaSet) round(ctx context.Context) {
	replicas, err := r.pg.Replicas(ctx)
	if err != nil {
		r.warn(ctx, err, "Reading the replicas failed; taking no agent this round")
		return
	}
	holders, err := r.pg.Holders(ctx)
	if err != nil {
		r.warn(ctx, err, "Reading the lease holders failed; taking no agent this round")
		return
	}
	var wanted []int64
	for _, a := range r.agents {
		if !r.serves(a.cfg.Name) {
			wanted = append(wanted, a.principal)
		}
	}
	free, err := r.pg.Free(ctx, wanted)
	if err != nil {
		r.warn(ctx, err, "Reading the free leases failed; taking no agent this round")
		return
	}
	live := make(map[string]bool)
	for _, rep := range replicas {
		live[rep.ID] = rep.Live
	}
	dead, silent := make(map[string]bool), make(map[string]bool)
	for _, h := range holders {
		switch {
		case h.Replica == "" || h.Replica == r.pg.ReplicaID():
		case free[h.Principal]:
			dead[h.Replica] = true
		case !live[h.Replica]:
			// A replica that stopped beating (stalled, cut off) may still
			// hold leases on sessions the server has not found idle yet.
			silent[h.Replica] = true
		}
	}
	// Their sessions end now, and their agents are taken at the next
	// round.
	for id := range silent {
		r.terminate(ctx, id)
	}
	n := 0
	for id, ok := range live {
		if ok && !dead[id] {
			n++
		}
	}
	n = max(n, 1)
	share := (len(r.agents) + n - 1) / n
	// Past the share, the last agents in the configured order go back
	// first, one a round: a replica that joined takes them.
	if r.held() > share {
		for i := len(r.agents) - 1; i >= 0; i-- {
			if r.serves(r.agents[i].cfg.Name) {
				r.handBack(r.agents[i].cfg.Name, "over the fair share")
				return
			}
		}
	}
	// Each replica looks from its own place in the list, so replicas
	// taking at once mostly try different agents.
	h := fnv.New32a()
	_, _ = h.Write([]byte(r.pg.ReplicaID()))
	first := int(h.Sum32() % uint32(len(r.agents)))
	for i := range r.agents {
		a := r.agents[(first+i)%len(r.agents)]
		if r.held() >= share || ctx.Err() != nil {
			return
		}
		if free[a.principal] && !r.serves(a.cfg.Name) && time.Now().After(r.cooling[a.cfg.Name]) {
			r.take(ctx, a)
		}
	}
}

// terminate ends a silent replica's lease sessions.
func (r *replicaSet) terminate(ctx context.Context, id string) {
	n, err := r.pg.TerminateLeases(ctx, id)
	if err != nil {
		r.warn(ctx, err, "Ending a silent replica's leases failed; they drop when the server finds them idle")
		return
	}
	if n > 0 {
		r.log.Warn().Str("silent_replica", id).Int("sessions", n).Msg("Ended the lease sessions of a replica that stopped beating")
	}
}

// warn logs a round's failure, unless the round was stopped.
func (r *replicaSet) warn(ctx context.Context, err error, msg string) {
	if ctx.Err() == nil {
		r.log.Warn().Err(err).Msg(msg)
	}
}

// take takes a's lease and starts serving a; the lease goes back when the
// agent does not start.
func (r *replicaSet) take(ctx context.Context, a replicaAgent) {
	began := time.Now()
	l, held, err := r.pg.TryLease(ctx, a.principal)
	if err != nil || !held {
		if err != nil {
			r.warn(ctx, err, "Taking an agent's lease failed")
		}
		return
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	run, err := r.d.startAgent(sctx, r.cfg, a.cfg, a.answer, a.ref, r.onFault(a.cfg.Name))
	if err != nil {
		if rerr := l.Release(context.Background()); rerr != nil {
			r.log.Warn().Err(rerr).Str("agent", a.cfg.Name).Msg("Handing the lease back failed; it drops with its connection")
		}
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, context.DeadlineExceeded):
			// The homeserver kept failing: another round, or another
			// replica, tries again.
			r.log.Warn().Err(err).Str("agent", a.cfg.Name).Msg("The agent did not start in time; its lease goes back")
		default:
			// Refused credentials, a crypto store the pickle key does not
			// open: no replica mends that by trying again, so this one
			// stops, as a daemon serving every agent would.
			r.d.fault(fmt.Errorf("agent %s: %w", a.cfg.Name, err))
		}
		return
	}
	r.mu.Lock()
	r.serving[a.cfg.Name] = &servedAgent{lease: l, run: run}
	r.mu.Unlock()
	r.taken.Add(1)
	r.log.Info().Str("agent", a.cfg.Name).Int64("generation", l.Generation).Dur("took", time.Since(began)).
		Msg("Took the agent's lease; serving it")
	go func() {
		<-l.Lost()
		select {
		case r.lost <- l:
		case <-ctx.Done():
		}
	}()
}

// drop stops serving the agent whose lease l was lost, unless it was
// handed back (and so already stopped).
func (r *replicaSet) drop(l *pgfs.Lease) {
	r.mu.Lock()
	var name string
	for n, s := range r.serving {
		if s.lease == l {
			name = n
		}
	}
	s, ok := r.serving[name]
	if ok {
		delete(r.serving, name)
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	r.log.Warn().Str("agent", name).Int64("generation", l.Generation).Msg("The agent's lease was lost; no longer serving it")
	r.d.stopAgent(s.run)
	r.cooling[name] = time.Now().Add(r.pg.Takeover())
}

// handBack stops serving the agent named name, then hands its lease back
// at once.
func (r *replicaSet) handBack(name, why string) {
	r.mu.Lock()
	s, ok := r.serving[name]
	delete(r.serving, name)
	r.mu.Unlock()
	if !ok {
		return
	}
	r.d.stopAgent(s.run)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.lease.Release(ctx); err != nil {
		r.log.Warn().Err(err).Str("agent", name).Msg("Handing the lease back failed; it drops with its connection")
		return
	}
	r.log.Info().Str("agent", name).Str("reason", why).Msg("Handed the agent's lease back")
}

// onFault is the fault hook of the agent named name's principal. A write
// refused for a lost lease stops nothing more than the agent, which its
// lease's loss already does; any other fault stops the daemon.
func (r *replicaSet) onFault(name string) func(error) {
	return func(err error) {
		if errors.Is(err, pgfs.ErrLeaseLost) {
			r.log.Warn().Err(err).Str("agent", name).Msg("The agent stopped: its lease is gone")
			return
		}
		r.d.fault(fmt.Errorf("agent %s: %w", name, err))
	}
}

// stop hands every lease back and leaves the replicas: the others take
// the agents over at once.
func (r *replicaSet) stop() {
	if r.stopLoop != nil {
		r.stopLoop()
		r.loop.Wait()
	}
	for i := len(r.agents) - 1; i >= 0; i-- {
		r.handBack(r.agents[i].cfg.Name, "shutting down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.pg.Leave(ctx); err != nil {
		r.log.Warn().Err(err).Msg("Leaving the replicas failed; the others see this one silent after the takeover time")
	}
}

// ServeHTTP answers an authorized API request for an agent this replica
// does not serve: forwarded to the replica that does, or refused as
// unavailable while the agent has none, or was forwarded here already.
func (r *replicaSet) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	name := req.PathValue("agent")
	if req.Header.Get(forwardedHeader) != "" {
		unavailable(w, "the agent moved between replicas; ask again")
		return
	}
	id, owner, err := r.pg.Owner(req.Context(), name)
	switch {
	case errors.Is(err, pgfs.ErrNoOwner), err == nil && id == r.pg.ReplicaID():
		unavailable(w, "the agent is being taken over by a replica; ask again")
		return
	case err != nil:
		r.log.Warn().Err(err).Str("agent", name).Msg("Finding the agent's replica failed")
		unavailable(w, "the agent's replica could not be found; ask again")
		return
	}
	target, err := url.Parse(owner)
	if err != nil {
		r.log.Warn().Err(err).Str("agent", name).Str("replica", id).Msg("The replica advertises a URL that does not parse")
		unavailable(w, "the agent's replica cannot be reached; ask again")
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set(forwardedHeader, r.pg.ReplicaID())
		},
		// Streams and long-polls pass through as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			r.log.Warn().Err(err).Str("agent", name).Str("replica", id).Msg("Forwarding to the agent's replica failed")
			unavailable(w, "the agent's replica cannot be reached; ask again")
		},
	}
	proxy.ServeHTTP(w, req)
}

// unavailable refuses a request the agent's replica cannot answer now.
func unavailable(w http.ResponseWriter, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = fmt.Fprintf(w, `{"error":{"code":"unavailable","message":%q}}`, message)
}
