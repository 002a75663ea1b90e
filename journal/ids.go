package journal

import "strings"

// maxIDLength is the Matrix specification's bound on user, room and event IDs.
const maxIDLength = 255

// ValidUserID reports whether s has the shape of a full Matrix user ID
// (@localpart:server).
func ValidUserID(s string) bool {
	if !validOpaqueID(s, '@') {
		return false
	}
	local, server, ok := strings.Cut(s[1:], ":")
	return ok && local != "" && server != ""
}

// ValidRoomID reports whether s has the shape of a Matrix room ID. Newer room
// versions drop the server part, so only the sigil and the character set are
// checked.
func ValidRoomID(s string) bool { return validOpaqueID(s, '!') }

// ValidEventID reports whether s has the shape of a Matrix event ID.
func ValidEventID(s string) bool { return validOpaqueID(s, '$') }

// validOpaqueID accepts a sigil followed by 1..254 printable, non-space ASCII
// bytes. Matrix IDs are ASCII; anything else is a forgery or corruption and
// would make byte-order comparisons disagree between backends.
func validOpaqueID(s string, sigil byte) bool {
	if len(s) < 2 || len(s) > maxIDLength || s[0] != sigil {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}
