package main

import (
	"context"

	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/store"
)

// sessionsOf is where the agents' Matrix sessions are kept: in the
// journal's database on PostgreSQL, so every daemon sharing it signs an
// agent in on the same device; in the storage directory's files on SQLite.
func sessionsOf(js *store.Store, storage string) matrix.Sessions {
	files := matrix.FileSessions{StorageDir: storage}
	if pg := js.Postgres(); pg != nil {
		return dbSessions{pg: pg, files: files}
	}
	return files
}

// dbSessions keeps sessions in the database. A session the database does
// not hold yet is read from the storage directory's file, as a daemon
// that ran on SQLite files, or before sessions moved into the database,
// left it: the device it names is kept.
type dbSessions struct {
	pg    *pgfs.Store
	files matrix.FileSessions
}

// LoadSession implements matrix.Sessions.
func (d dbSessions) LoadSession(ctx context.Context, agent string) (matrix.Session, error) {
	user, device, token, found, err := d.pg.LoadSession(ctx, agent)
	if err != nil || !found {
		if err == nil {
			return d.files.LoadSession(ctx, agent)
		}
		return matrix.Session{}, err
	}
	return matrix.Session{UserID: user, DeviceID: device, AccessToken: token}, nil
}

// SaveSession implements matrix.Sessions.
func (d dbSessions) SaveSession(ctx context.Context, agent string, s matrix.Session) error {
	return d.pg.SaveSession(ctx, agent, s.UserID, s.DeviceID, s.AccessToken)
}
