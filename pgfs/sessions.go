package pgfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Matrix sessions: on PostgreSQL an agent's session (its user, device and
// access token) lives in the database beside its olm account, so any
// replica signs the agent in on the same device.
const (
	selectSession = `SELECT user_id, device_id, access_token FROM matrix_sessions WHERE agent = $1`
	upsertSession = `INSERT INTO matrix_sessions (agent, user_id, device_id, access_token, updated_ms)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (agent) DO UPDATE SET user_id = excluded.user_id, device_id = excluded.device_id,
		access_token = excluded.access_token, updated_ms = excluded.updated_ms`
)

// LoadSession reads agent's Matrix session; found is false when none is
// stored.
func (s *Store) LoadSession(ctx context.Context, agent string) (userID, deviceID, token string, found bool, err error) {
	err = s.pool.QueryRow(ctx, selectSession, agent).Scan(&userID, &deviceID, &token)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", "", false, nil
	}
	if err != nil {
		return "", "", "", false, fmt.Errorf("read matrix session: %w", redact(err))
	}
	return userID, deviceID, token, true, nil
}

// SaveSession stores agent's Matrix session, replacing the one before.
func (s *Store) SaveSession(ctx context.Context, agent, userID, deviceID, token string) error {
	if _, err := s.pool.Exec(ctx, upsertSession, agent, userID, deviceID, token, s.now().UnixMilli()); err != nil {
		return fmt.Errorf("store matrix session: %w", redact(err))
	}
	return nil
}
