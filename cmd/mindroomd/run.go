package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
)

// errBackendUnavailable refuses a configured back-end this build cannot run
// yet.
var errBackendUnavailable = errors.New("back-end not available in this build")

// daemon is what run started, stopped in the reverse order.
type daemon struct {
	log        zerolog.Logger
	store      *store.Store
	system     *actor.ActorSystem
	principals []*actor.PID
	faults     chan error
}

// runDaemon runs the agents cfgPath configures until ctx ends or a fault
// stops the journal or an agent, then shuts down in order: the principals
// (their sync loops, workers, fences and outboxes) first, the writer last,
// after it committed everything already accepted.
func runDaemon(ctx context.Context, stderr io.Writer, cfgPath string) (err error) {
	cfg, err := config.Load(cfgPath, nil)
	if err != nil {
		return err
	}
	d := &daemon{log: zerolog.New(stderr).With().Timestamp().Logger(), faults: make(chan error, len(cfg.Agents)+1)}
	defer func() { err = errors.Join(err, d.stop()) }()
	if d.store, err = store.Open(ctx, store.Options{StorageDir: cfg.Storage, Log: d.log}); err != nil {
		return err
	}
	d.system = actors.NewSystem(d.log)
	for i, a := range cfg.Agents {
		if err := d.startAgent(ctx, cfg, a); err != nil {
			return fmt.Errorf("agents[%d] %s: %w", i, a.Name, err)
		}
	}
	d.log.Info().Int("agents", len(cfg.Agents)).Str("storage", cfg.Storage).Msg("mindroomd running")
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

// startAgent signs one agent in and starts its principal.
func (d *daemon) startAgent(ctx context.Context, cfg *config.Config, a config.Agent) error {
	var answer principal.Agent
	switch a.Backend.Type {
	case config.BackendEcho:
		answer = agent.Echo{}
	case config.BackendHTTP:
		// An outside agent takes the work through the agent API.
	default:
		return &config.Error{Field: "backend.type", Err: fmt.Errorf("%w: %s", errBackendUnavailable, a.Backend.Type)}
	}
	view, err := d.store.Principal(ctx, a.Name, a.UserID)
	if err != nil {
		return err
	}
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: cfg.Homeserver, UserID: a.UserID,
		Password: a.Password.Reveal(), AccessToken: a.AccessToken.Reveal(), Agent: a.Name, StorageDir: cfg.Storage,
		Log: d.log.With().Str("agent", a.Name).Logger()})
	if err != nil {
		return err
	}
	d.principals = append(d.principals, d.system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: client, Agent: answer,
		Sender: matrix.NewSender(client), Reconciler: matrix.NewReconciler(client), DeviceID: client.DeviceID(),
		Hints: d.store.Hints(), AutoJoin: a.AutoJoin, Log: d.log.With().Str("agent", a.Name).Logger(),
		OnFault: func(err error) { d.faults <- fmt.Errorf("agent %s: %w", a.Name, err) },
	})))
	return nil
}

// stop shuts down what started: the principals, then the journal.
func (d *daemon) stop() error {
	for i := len(d.principals) - 1; i >= 0; i-- {
		if err := d.system.Root.StopFuture(d.principals[i]).Wait(); err != nil {
			d.log.Warn().Err(err).Msg("Stopping a principal failed")
		}
	}
	if d.store == nil {
		return nil
	}
	return d.store.Close()
}
