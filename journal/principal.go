package journal

import "fmt"

// maxAgentNameLength bounds agent names so they stay readable in logs and keys.
const maxAgentNameLength = 64

// Principal is one agent acting through one Matrix account. Two agents sharing
// an account are two principals and never see each other's rows.
type Principal struct {
	// Agent is the configured agent name. Turn records are scoped to it alone,
	// so a re-login under another Matrix ID does not answer everything again.
	Agent string
	// UserID is the full Matrix user ID the agent signs in as.
	UserID string
}

// NewPrincipal validates both halves of a principal.
func NewPrincipal(agent, userID string) (Principal, error) {
	if !validAgentName(agent) {
		return Principal{}, fmt.Errorf("%w: agent name %q must be 1-%d of [A-Za-z0-9._-]", ErrInvalidPrincipal, agent, maxAgentNameLength)
	}
	if !ValidUserID(userID) {
		return Principal{}, fmt.Errorf("%w: %q is not a full Matrix user ID", ErrInvalidPrincipal, userID)
	}
	return Principal{Agent: agent, UserID: userID}, nil
}

// String is the readable form, agent@@user:server.
func (p Principal) String() string { return p.Agent + "@" + p.UserID }

func validAgentName(s string) bool {
	if s == "" || len(s) > maxAgentNameLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// DefaultStorageDir is the storage root when none is given: the SQLite
// journal under it, the Matrix sessions beside it.
const DefaultStorageDir = "./mindroom_data"
