// Package bench holds the journal's `go test -bench` suites: a conversation
// walk and deep pages over a cached 10^6-message fixture, admission through
// the writer actor against a naive-schema baseline, and bytes on disk per
// message. Everything lives in _test.go files; `make bench` runs the suite
// and bench/cmd/summary condenses its output.
//
// Flags (after -args): -n sizes the walked conversation (default 10^6).
// Under -short every size shrinks so the suite runs in seconds as a smoke
// test.
package bench
