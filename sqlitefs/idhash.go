package sqlitefs

import "hash/fnv"

// idHashFunc is the SQL name of IDHash, registered on writer connections so
// a migration can hash the event IDs already stored.
const idHashFunc = "mindroomd_id_hash"

// idHash is the function behind IDHash and its SQL twin. It is a variable
// only so a test can force two IDs onto one hash, the collision every
// lookup must survive but a 64-bit hash almost never produces by chance.
var idHash = fnv64a

// IDHash is the identity index's key for an event ID: FNV-1a, 64 bits. Two
// IDs may share a hash; every lookup also compares the ID itself.
func IDHash(eventID string) int64 { return idHash(eventID) }

func fnv64a(eventID string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(eventID))
	return int64(h.Sum64())
}
