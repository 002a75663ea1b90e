// Package principal is the actor of one configured agent account: it owns
// the account's sync loop, turns each sync response into one admission
// batch, reports membership changes to the fence, and offers the
// principal's pending work to its Agent in receipt order. It starts and
// stops the principal's own fence and outbox actors, so one principal's slow
// agent, sync or sends never hold up another's.
package principal

import (
	"context"
	"encoding/json"
	"github.com/mindroomd/mindroomd/agent"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Defaults for Deps.
const (
	DefaultSyncTimeout = 30 * time.Second
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
	// DefaultKeyDeadline is how long an encrypted event waits for its key
	// (journal.DefaultKeyDeadline).
	DefaultKeyDeadline = journal.DefaultKeyDeadline
	// DefaultMaxUpload caps the file an agent answers with (20 MiB): the
	// file is read whole before it is uploaded, so the cap bounds what a
	// turn holds in memory. The homeserver's own limit may be lower; its
	// refusal is answered like an oversized file.
	DefaultMaxUpload = 20 << 20
	// DefaultTypingRenew is how often the agent's typing notice is
	// renewed while it answers: well within its timeout (half again as
	// long), so a slow answer shows typing throughout.
	DefaultTypingRenew = 20 * time.Second
	// DefaultProgressBurst and DefaultProgressRefill pace the progress
	// edits of a streamed answer as Synapse's default rate limit for
	// messages does (rc_message: a burst of 10, then 0.2 a second): a
	// homeserver that refuses edits with 429 would also hold up the answer
	// itself, which the outbox sends as the same account.
	DefaultProgressBurst  = 10
	DefaultProgressRefill = 5 * time.Second
)

// Deps are the actor's collaborators.
type Deps struct {
	// Store is the principal-bound journal view.
	Store journal.PrincipalStore
	// Conversation, when set, is what a turn reads its conversation
	// through (Turn.Conversation) instead of Store: a reader that hydrates
	// a cold conversation from the homeserver first.
	Conversation journal.ConversationReader
	// Transport is the homeserver, signed in as the principal's account.
	Transport Transport
	// Agent answers the principal's work. Nil leaves the work to an agent
	// outside the process, which takes it through the agent API: the
	// principal then only syncs and delivers.
	Agent agent.Agent
	// Sender and Reconciler deliver replies; DeviceID is the device the
	// Transport is signed in as.
	Sender     outbox.Sender
	Reconciler outbox.Reconciler
	DeviceID   string
	// Hints is the store's after-commit bus, which wakes the worker and
	// the outbox. Nil takes it from Store when Store has one
	// (store.View.Hints); Props panics when there is none.
	Hints *hint.Bus
	// Crypto, when set, is the account's end-to-end encryption: it takes
	// each sync response's device news before the batch is admitted and
	// decrypts what the batch brings. Without it ciphertext is journaled
	// as context only.
	Crypto Crypto
	// KeyDeadline is how long an encrypted event may wait for its key
	// before it is settled as undecryptable (DefaultKeyDeadline).
	KeyDeadline time.Duration
	// KeyNoticeAfter is how long a live message waits for its key before
	// the room is told, once per session, that the agent cannot read it
	// yet; 0 tells nothing.
	KeyNoticeAfter time.Duration
	// ApprovalSweep is how often, at most, the tool calls nobody decided
	// in time are decided as expired (the sweep also wakes at the soonest
	// expiry and after every commit); zero means DefaultApprovalSweep.
	ApprovalSweep time.Duration
	// ApprovalKeys are the reactions that decide a tool call on its card;
	// zero means journal.DefaultApprovalKeys. The agent API's cards must
	// name the same.
	ApprovalKeys journal.ApprovalKeys
	// AutoJoin accepts room invites.
	AutoJoin bool
	// Placeholder, when set, is the content of a placeholder sent before
	// the agent is asked; the answer then replaces it as an edit.
	Placeholder json.RawMessage
	// MaxUpload caps the file an Agent's reply sends (agent.File), in
	// bytes; zero means DefaultMaxUpload. A larger file is answered with a
	// notice that it could not be sent.
	MaxUpload int64
	// TypingRenew is how often the agent's typing notice is renewed while
	// the Agent answers a message (when the Transport can show one); zero
	// means DefaultTypingRenew, a negative value shows no typing.
	TypingRenew time.Duration
	// ProgressBurst and ProgressRefill pace a turn's progress edits (all
	// the principal's turns share one budget): ProgressBurst edits at
	// once, then one per ProgressRefill. Zero means DefaultProgressBurst
	// and DefaultProgressRefill.
	ProgressBurst  int
	ProgressRefill time.Duration
	Log            zerolog.Logger
	Now            func() time.Time
	// SyncTimeout is the long-poll timeout of one sync.
	SyncTimeout time.Duration
	// BackoffBase and BackoffMax bound the retry delays of a failed sync
	// and of a turn whose agent failed.
	BackoffBase, BackoffMax time.Duration
	// OnFault, when set, learns of a fault that stopped the actor (the
	// account's access token stopped working).
	OnFault func(error)
	// OnSynced, when set, learns of each sync response admitted, with its
	// admission results; OnDelivery of each step a reply passes (metrics
	// listen here).
	OnSynced   func(results []journal.AdmitResult)
	OnDelivery func(outbox.Point)
}

// withTurnDefaults gives the turn's own settings their defaults.
func (d Deps) withTurnDefaults() Deps {
	if d.MaxUpload <= 0 {
		d.MaxUpload = DefaultMaxUpload
	}
	if d.TypingRenew == 0 {
		d.TypingRenew = DefaultTypingRenew
	}
	if d.ProgressBurst <= 0 {
		d.ProgressBurst = DefaultProgressBurst
	}
	if d.ProgressRefill <= 0 {
		d.ProgressRefill = DefaultProgressRefill
	}
	return d
}

// Props returns the actor's props. A failure stops the actor, and with it
// the principal's fence and outbox, instead of restarting them.
func Props(d Deps) *actor.Props {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.SyncTimeout <= 0 {
		d.SyncTimeout = DefaultSyncTimeout
	}
	if d.BackoffBase <= 0 {
		d.BackoffBase = DefaultBackoffBase
	}
	if d.BackoffMax <= 0 {
		d.BackoffMax = DefaultBackoffMax
	}
	if d.KeyDeadline <= 0 {
		d.KeyDeadline = DefaultKeyDeadline
	}
	if d.ApprovalSweep <= 0 {
		d.ApprovalSweep = DefaultApprovalSweep
	}
	d = d.withTurnDefaults()
	if d.Hints == nil {
		// A bus of its own would never hear a commit, and the principal
		// would journal work and never answer it: the store's is the only
		// one that will do.
		h, ok := d.Store.(interface{ Hints() *hint.Bus })
		if !ok {
			panic("principal: Deps.Hints is required: the store's after-commit bus")
		}
		d.Hints = h.Hints()
	}
	return actor.PropsFromProducer(func() actor.Actor {
		return &principalActor{deps: d, approvals: approvalState{wake: make(chan struct{}, 1)}}
	},
		actor.WithGuardian(actors.StopOnFailure()), actor.WithSupervisor(actors.StopOnFailure()))
}

type principalActor struct {
	deps Deps
	log  zerolog.Logger
	root *actor.RootContext
	// members applies the principal's departures and joins in order.
	members *membership
	outbox  *actor.PID
	// loopCtx is the loops' context, cancelled when the actor stops.
	loopCtx context.Context
	cancel  context.CancelFunc
	loops   sync.WaitGroup

	// joins are the invites not accepted yet, by room (sync.go); joinWake
	// tells the join loop of new ones. accepted are the rooms this run
	// joined by accepting an invite, with the epoch the join began, until
	// a sync shows them (caughtUp).
	joinMu    sync.Mutex
	joins     map[string]*pendingJoin
	accepted  map[string]int64
	joinOrder int
	joinWake  chan struct{}

	// tokenMu orders the writes of the sync token: each batch's, and the
	// one an accepted invite makes when it lets go of the token it held
	// (release). synced is the next_batch of the last batch admitted,
	// where the sync stands; stored is the token last written.
	tokenMu        sync.Mutex
	synced, stored string

	// pace is the budget every turn's progress edits share (progress.go):
	// the homeserver's rate limit is the account's, not the turn's.
	paceOnce sync.Once
	pace     *bucket

	// approvals is the tool approvals' bookkeeping (approvals.go).
	approvals approvalState
}

// Receive implements actor.Actor.
func (a *principalActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *Leave:
		a.leave(ctx, m)
	case *stopped:
		a.log.Error().Err(m.err).Str("loop", m.loop).Msg("Principal stopped")
		if a.deps.OnFault != nil {
			a.deps.OnFault(m.err)
		}
		ctx.Stop(ctx.Self())
	case *actor.Stopping:
		if a.cancel != nil {
			a.cancel()
		}
		a.loops.Wait()
		// The outbox sends on its own, and stops after the loops.
		if a.outbox != nil {
			_ = a.root.StopFuture(a.outbox).Wait()
		}
	}
}

func (a *principalActor) start(ctx actor.Context) {
	p := a.deps.Store.Principal()
	a.log = a.deps.Log.With().Str("principal", p.String()).Logger()
	a.root = ctx.ActorSystem().Root
	a.members = &membership{store: a.deps.Store, log: a.log}
	// The outbox is an actor with supervision of its own (it stops on
	// failure), so it is spawned beside this one and stopped with it, not
	// as a child.
	a.outbox = a.root.Spawn(outbox.Props(outbox.Deps{
		Outbox: a.deps.Store, Sender: a.deps.Sender, Reconciler: a.deps.Reconciler, DeviceID: a.deps.DeviceID,
		Hints: a.deps.Hints.Subscribe(p.String()), Now: a.deps.Now, Log: a.log.With().Str("actor", "outbox").Logger(),
		Observe: a.observeDelivery,
	}))
	loopCtx, cancel := context.WithCancel(context.Background())
	a.loopCtx, a.cancel = loopCtx, cancel
	self := ctx.Self()
	run := func(name string, loop func(context.Context) error) {
		a.loops.Add(1)
		go func() {
			defer a.loops.Done()
			if err := loop(loopCtx); err != nil && loopCtx.Err() == nil {
				a.root.Send(self, &stopped{loop: name, err: err})
			}
		}()
	}
	a.joins, a.joinWake, a.accepted = map[string]*pendingJoin{}, make(chan struct{}, 1), map[string]int64{}
	run("owed", func(ctx context.Context) error { a.members.sayOwed(ctx); return nil })
	run("sync", a.syncLoop)
	// Votes are judged with or without an Agent: an agent outside the
	// process waits for its calls' decisions too.
	run("approvals", a.approvalsLoop)
	if a.deps.Crypto != nil {
		run("keys", a.keysLoop)
	}
	if a.deps.AutoJoin {
		run("join", a.joinLoop)
	}
	if a.deps.Agent != nil {
		run("work", a.workLoop)
	}
}

// observeDelivery passes a reply's steps on to OnDelivery.
func (a *principalActor) observeDelivery(p outbox.Point, _ journal.Delivery) {
	if a.deps.OnDelivery != nil {
		a.deps.OnDelivery(p)
	}
}

// leave fences the room, then leaves it on the homeserver, off the actor's
// goroutine; the reply goes to whoever asked.
func (a *principalActor) leave(ctx actor.Context, m *Leave) {
	sender := ctx.Sender()
	a.loops.Add(1)
	go func() {
		defer a.loops.Done()
		err := a.leaveRoom(a.loopCtx, m.RoomID)
		if sender != nil {
			a.root.Send(sender, &Left{Err: err})
		}
	}()
}

// sleep waits d or until ctx ends, reporting whether the wait completed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoffAfter is the delay after failures consecutive failures:
// exponential from base to max, with jitter in its upper half.
func backoffAfter(failures int, base, max time.Duration) time.Duration {
	d := base << min(failures-1, 20)
	if d > max || d <= 0 {
		d = max
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
