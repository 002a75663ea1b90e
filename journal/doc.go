// Package journal holds mindroomd's domain types and pure rules: principal
// identity, event parsing and classification, canonical JSON, revision
// ordering, the wire conventions shared with MindRoom clients, and the narrow
// view interfaces runtime collaborators depend on.
//
// Nothing here touches SQL, actors or the network, so every rule can be
// table-tested on its own and shared unchanged by every storage backend.
package journal
