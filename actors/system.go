// Package actors holds what every actor package shares: the actor system
// constructor with protoactor's logging routed into zerolog.
package actors

import (
	"context"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	cmap "github.com/orcaman/concurrent-map"
	"github.com/rs/zerolog"
)

// protoactor keeps a process registry of 1024 concurrent maps per actor
// system, and each map's default 32 shards cost about 2.9 MB of live heap
// per system whatever runs in it: most of an idle daemon's heap. The
// registry already spreads its locks over those 1024 buckets, so one shard
// each serves the same load. The count is read when a map is made, so it
// is set before any system exists.
func init() { cmap.SHARD_COUNT = 1 }

// NewSystem returns an actor system that logs through log instead of
// protoactor's default coloured slog output.
func NewSystem(log zerolog.Logger) *actor.ActorSystem {
	h := &slogBridge{log: log.With().Str("component", "protoactor").Logger()}
	return actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(h) }),
		actor.WithDeadLetterRequestLogging(false),
	)
}

// StopOnFailure is the explicit supervision for actors that hold durable
// state: a failure stops the actor instead of the default ten silent
// restarts, so a fault is seen rather than hidden.
func StopOnFailure() actor.SupervisorStrategy {
	return actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })
}

// slogBridge is a minimal slog.Handler writing into zerolog.
type slogBridge struct {
	log   zerolog.Logger
	attrs []slog.Attr
}

func (h *slogBridge) Enabled(_ context.Context, l slog.Level) bool {
	return h.log.GetLevel() <= zerologLevel(l)
}

func (h *slogBridge) Handle(_ context.Context, r slog.Record) error {
	e := h.log.WithLevel(zerologLevel(r.Level))
	for _, a := range h.attrs {
		e = e.Str(a.Key, a.Value.String())
	}
	r.Attrs(func(a slog.Attr) bool {
		e = e.Str(a.Key, a.Value.String())
		return true
	})
	e.Msg(r.Message)
	return nil
}

func (h *slogBridge) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &slogBridge{log: h.log, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *slogBridge) WithGroup(string) slog.Handler { return h }

func zerologLevel(l slog.Level) zerolog.Level {
	switch {
	case l >= slog.LevelError:
		return zerolog.ErrorLevel
	case l >= slog.LevelWarn:
		return zerolog.WarnLevel
	case l >= slog.LevelInfo:
		// protoactor narrates every spawn and stop at info; keep it at debug.
		return zerolog.DebugLevel
	}
	return zerolog.TraceLevel
}
