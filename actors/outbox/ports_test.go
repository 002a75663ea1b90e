package outbox_test

import (
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/matrix"
)

// The Matrix port implements the outbox's ports.
var (
	_ outbox.Sender     = (*matrix.Sender)(nil)
	_ outbox.Sessions   = (*matrix.Sender)(nil)
	_ outbox.Reconciler = (*matrix.Reconciler)(nil)
)
