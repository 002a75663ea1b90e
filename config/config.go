// Package config loads the daemon's configuration: one strict YAML file,
// overridden field by field from the environment, validated as a whole and
// with its secrets read from their files.
//
// A relative path in the file (storage, password_file, access_token_file,
// api_token_file, api_key_file) is relative to the directory holding the
// file, so the same file works whatever the working directory of the
// process. A relative MINDROOM_STORAGE is relative to the working
// directory, like any path given on a command line.
//
// Every error Load and Parse return is an *Error and matches ErrConfig.
// None of them carries the text of a secret.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/mindroomd/mindroomd/journal"
)

// Defaults of the daemon's own optional fields. A back-end's optional keys
// left out stay zero here, and the back-end gives them its defaults.
const (
	DefaultStorage = journal.DefaultStorageDir
	// DefaultPickleKeyFile is the pickle key's file under the storage
	// directory.
	DefaultPickleKeyFile = "pickle.key"
	// DefaultKeyDeadline is how long an encrypted event waits for its key.
	DefaultKeyDeadline = journal.DefaultKeyDeadline
	// DefaultKeyNoticeAfter is how long a message waits for its key before
	// the room is told.
	DefaultKeyNoticeAfter = time.Minute
	DefaultListen         = "127.0.0.1:8787"
	// DefaultMediaMaxBytes caps a file the agent API downloads or uploads.
	DefaultMediaMaxBytes = 20 << 20
	// MaxMediaMaxBytes bounds media_max_bytes: a file is spooled to disk
	// or held whole while it passes through.
	MaxMediaMaxBytes = 1 << 30
	// DefaultReadReceipts is when an agent marks a room read.
	DefaultReadReceipts = ReceiptsOnSettle
)

// ReadReceipts says when an agent sends a read receipt for a room.
type ReadReceipts string

// The read receipt modes.
const (
	// ReceiptsOff sends none.
	ReceiptsOff ReadReceipts = "off"
	// ReceiptsOnSettle marks an event read once it settled: answered,
	// ignored or dropped.
	ReceiptsOnSettle ReadReceipts = "settle"
	// ReceiptsOnAnswer marks an event read once an answer to it was
	// enqueued.
	ReceiptsOnAnswer ReadReceipts = "answer"
)

// MaxContextMessages bounds context_messages: the history of one request is
// read in one page.
const MaxContextMessages = 1000

// envPrefix starts the names of the daemon's own variables, which no
// back-end's env may name.
const envPrefix = "MINDROOM_"

// The environment variables that override the file, one per field.
const (
	EnvHomeserver = "MINDROOM_HOMESERVER"
	EnvStorage    = "MINDROOM_STORAGE"
	EnvListen     = "MINDROOM_LISTEN"
	// EnvDatabaseURL holds the PostgreSQL URL itself, a secret, in place of
	// database_url_file.
	EnvDatabaseURL = "MINDROOM_DATABASE_URL"
	EnvReplicaID   = "MINDROOM_REPLICA_ID"
)

// ReplicasAuto is Config.Replicas of a replica of several.
const ReplicasAuto = "auto"

// MaxReplicaID is the longest replica_id: PostgreSQL keeps 63 bytes of
// the application name that carries it.
const MaxReplicaID = 45

// DefaultReplicaTakeover is Config.ReplicaTakeover's default.
const DefaultReplicaTakeover = 10 * time.Second

// ErrConfig matches every error of this package, so that a caller can tell a
// configuration it must not retry from any other failure.
var ErrConfig = errors.New("invalid configuration")

// Error is a configuration error. Field names the offending field as it is
// written in the file (agents[0].user_id); it is empty when the file as a
// whole is at fault (unreadable, not YAML, an unknown key, which the YAML
// message names with its line).
type Error struct {
	Field string
	Err   error
}

// Error is "field: reason", or the reason alone for a whole-file error.
func (e *Error) Error() string {
	if e.Field == "" {
		return e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error()
}

// Unwrap returns the reason.
func (e *Error) Unwrap() error { return e.Err }

// Is makes every *Error match ErrConfig.
func (e *Error) Is(target error) bool { return target == ErrConfig }

func fieldErr(field, format string, args ...any) *Error {
	return &Error{Field: field, Err: fmt.Errorf(format, args...)}
}

// redacted stands in for a secret wherever a value would be printed.
const redacted = "[redacted]"

// Secret holds a credential read from a file. Every way of printing or
// encoding it shows a placeholder, so a config can be logged or dumped
// without leaking; only Reveal returns the value.
type Secret struct{ v string }

// NewSecret holds v as a secret, as a value read from a file is held.
func NewSecret(v string) Secret { return Secret{v: v} }

// Reveal returns the secret itself, for the one place that sends it.
func (s Secret) Reveal() string { return s.v }

// IsSet reports whether a value was read.
func (s Secret) IsSet() bool { return s.v != "" }

// String shows whether the secret is set, never its value.
func (s Secret) String() string {
	if s.v == "" {
		return ""
	}
	return redacted
}

// GoString keeps %#v as quiet as %v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// Format covers every verb, including %x and %q, which would otherwise
// bypass String.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, s.GoString())
		return
	}
	_, _ = io.WriteString(f, s.String())
}

// MarshalJSON encodes the placeholder.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(s.String())), nil }

// MarshalYAML encodes the placeholder.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// Config is the daemon's configuration, validated and with every path
// absolute when the file was loaded by Load.
type Config struct {
	// Homeserver is the http(s) base URL of the Matrix homeserver.
	Homeserver string `yaml:"homeserver"`
	// Storage is the journal's directory. Default ./mindroom_data. With a
	// database URL the journal lives in PostgreSQL and the directory keeps
	// only each agent's Matrix device.
	Storage string `yaml:"storage"`
	// DatabaseURLFile names a file holding a PostgreSQL URL: set, the
	// journal lives in that database instead of under Storage.
	DatabaseURLFile string `yaml:"database_url_file"`
	// DatabaseURL is the URL read from DatabaseURLFile or
	// MINDROOM_DATABASE_URL (which wins); it holds a password.
	DatabaseURL Secret `yaml:"-"`
	// PickleKeyFile names the secret file whose key encrypts the agents'
	// olm accounts and sessions in the crypto store. The daemon generates
	// it (0600) on its first start when it is absent. Default
	// <storage>/pickle.key.
	PickleKeyFile string `yaml:"pickle_key_file"`
	// KeyDeadline is how long an encrypted event may wait for its key
	// before it is settled as undecryptable. Default 24h.
	KeyDeadline time.Duration `yaml:"key_deadline"`
	// KeyNotice tells a room, once per megolm session, that a message in
	// it cannot be read yet because its key has not come. Default true.
	KeyNotice *bool `yaml:"key_notice"`
	// KeyNoticeAfter is how long a message waits for its key before the
	// notice goes out (keys often come a moment after their message).
	// Default 1m.
	KeyNoticeAfter time.Duration `yaml:"key_notice_after"`
	// MediaMaxBytes caps a file downloaded or uploaded through the agent
	// API, and an attachment a back-end sends. Default 20 MiB.
	MediaMaxBytes int64 `yaml:"media_max_bytes"`
	// Listen is the HTTP API's host:port. Default 127.0.0.1:8787. Any
	// address that is not loopback requires every agent's api_token_file.
	Listen string `yaml:"listen"`
	// Retention is how long each agent's settled data is kept, unless the
	// agent sets its own. Absent: everything is kept.
	Retention *Retention `yaml:"retention"`
	// Replicas, "auto", makes this daemon one replica of several sharing
	// the PostgreSQL journal: the live replicas divide the agents between
	// them, each serving an agent only while it holds the agent's lease.
	// Default "": this daemon serves every agent.
	Replicas string `yaml:"replicas"`
	// ReplicaID names this replica in status and among the lease holders.
	// Default <hostname>-<pid>; MINDROOM_REPLICA_ID wins.
	ReplicaID string `yaml:"replica_id"`
	// ReplicaURL is where the other replicas reach this one's agent API,
	// to forward an agent's requests to the replica serving it. Default
	// http://<listen>, with the host's name when listen is a wildcard.
	ReplicaURL string `yaml:"replica_url"`
	// ReplicaTakeover bounds how long the agents of a replica that died or
	// stalled wait for another: at least 2s, default 10s.
	ReplicaTakeover time.Duration `yaml:"replica_takeover"`
	// ReplicaLeaseCheck is how often a replica checks that the
	// connections holding its leases are alive. Default a fifth of the
	// takeover time. Whatever it is, a write after a lease was lost is
	// refused.
	ReplicaLeaseCheck time.Duration `yaml:"replica_lease_check"`
	// Agents are the configured agents; at least one, names unique.
	Agents []Agent `yaml:"agents"`
}

// DefaultRetentionInterval is how often retention runs when
// Retention.Interval is zero.
const DefaultRetentionInterval = time.Hour

// Retention is how long settled data is kept (docs/retention.md). A window
// left out keeps its kind for ever.
type Retention struct {
	// Bodies is how long a settled message stays in the conversation.
	Bodies time.Duration `yaml:"bodies"`
	// Payloads is how long a sent message's content stays in the outbox.
	Payloads time.Duration `yaml:"payloads"`
	// Turns is how long an answered turn's record stays.
	Turns time.Duration `yaml:"turns"`
	// Rejected is how long a malformed event's record stays.
	Rejected time.Duration `yaml:"rejected"`
	// Identities is how long an event's or a delivery's identity stays once
	// nothing else needs it: at least 24h, and at least every other window.
	Identities time.Duration `yaml:"identities"`
	// Interval is how often a pass runs, the first at start. Default 1h.
	Interval time.Duration `yaml:"interval"`
}

// Policy is the journal's policy of r.
func (r Retention) Policy() journal.RetentionPolicy {
	return journal.RetentionPolicy{Bodies: r.Bodies, Payloads: r.Payloads, Turns: r.Turns, Rejected: r.Rejected,
		Identities: r.Identities}
}

// RetentionOf is the retention agent a runs under: its own, else the
// file's, else none.
func (c *Config) RetentionOf(a Agent) *Retention {
	if a.Retention != nil {
		return a.Retention
	}
	return c.Retention
}

func (r *Retention) validate(field string) error {
	if r == nil {
		return nil
	}
	if r.Interval < 0 {
		return fieldErr(field+".interval", "%s is not a positive duration", r.Interval)
	}
	if err := r.Policy().Validate(); err != nil {
		return &Error{Field: field, Err: err}
	}
	return nil
}

// Agent is one agent and the Matrix account it acts through.
type Agent struct {
	// Name is the agent's name, 1-64 of [A-Za-z0-9._-].
	Name string `yaml:"name"`
	// UserID is the full Matrix user ID the agent signs in as.
	UserID string `yaml:"user_id"`
	// PasswordFile holds the account's password; exactly one of it and
	// AccessTokenFile is set.
	PasswordFile string `yaml:"password_file"`
	// AccessTokenFile holds an access token for the account.
	AccessTokenFile string `yaml:"access_token_file"`
	// APITokenFile holds the bearer token of this agent's /v1 routes.
	APITokenFile string `yaml:"api_token_file"`
	// RecoveryKeyFile holds the account's recovery key, which opens the
	// cross-signing keys kept in its secret storage. The daemon writes it
	// (0600) when it bootstraps cross-signing with the password; a person
	// can type it into Element. Default <storage>/matrix/<name>.recovery-key.
	RecoveryKeyFile string `yaml:"recovery_key_file"`
	// AutoJoin accepts room invites.
	AutoJoin bool `yaml:"auto_join"`
	// ReadReceipts is when the agent marks a room read: off, settle (an
	// event answered, ignored or dropped) or answer (an event answered).
	// Default settle.
	ReadReceipts ReadReceipts `yaml:"read_receipts"`
	// Typing shows the agent typing while a built-in back-end's turn runs.
	// Default true.
	Typing *bool `yaml:"typing"`
	// ApprovalKeys are the reactions that approve and deny a tool call on
	// its card. Default ✅ and ❌.
	ApprovalKeys ApprovalKeys `yaml:"approval_keys"`
	// Backend answers the agent's turns.
	Backend Backend `yaml:"backend"`
	// Retention, when set, is this agent's retention instead of the
	// file's.
	Retention *Retention `yaml:"retention"`

	// Password is the content of PasswordFile.
	Password Secret `yaml:"-"`
	// AccessToken is the content of AccessTokenFile.
	AccessToken Secret `yaml:"-"`
	// APIToken is the content of APITokenFile.
	APIToken Secret `yaml:"-"`
}

// Principal is the journal principal of the agent. It cannot fail on a
// loaded config, whose names and user IDs were validated.
func (a Agent) Principal() journal.Principal {
	return journal.Principal{Agent: a.Name, UserID: a.UserID}
}

// ApprovalKeys are an agent's approval reactions.
type ApprovalKeys struct {
	Approve string `yaml:"approve"`
	Deny    string `yaml:"deny"`
}

// BackendType names what answers an agent's turns.
type BackendType string

// The backend types.
const (
	// BackendEcho repeats the message back; for demos and tests.
	BackendEcho BackendType = "echo"
	// BackendExec runs a command per turn.
	BackendExec BackendType = "exec"
	// BackendHTTP leaves turns to a client of the HTTP API.
	BackendHTTP BackendType = "http"
	// BackendOpenAI calls an OpenAI-compatible chat completions API.
	BackendOpenAI BackendType = "openai"
)

// Backend is an agent's backend. The fields of the other types must be
// absent, so a misplaced key is refused rather than ignored.
type Backend struct {
	// Type is one of echo, exec, http, openai.
	Type BackendType `yaml:"type"`
	// Exec holds the keys of type exec, written beside type in the file.
	Exec Exec `yaml:",inline"`
	// OpenAI holds the keys of type openai, written beside type in the file.
	OpenAI OpenAI `yaml:",inline"`
	// Tools are the functions an openai back-end's model may call, each
	// run as a command; only for type openai.
	Tools []Tool `yaml:"tools"`
}

// Tool is a function the model may call (type openai).
type Tool struct {
	// Name is the function's name, 1-64 of [A-Za-z0-9_-], unique.
	Name string `yaml:"name"`
	// Description tells the model what the tool does.
	Description string `yaml:"description"`
	// Parameters is the JSON schema of the call's arguments, written as
	// YAML; absent is an object without properties.
	Parameters map[string]any `yaml:"parameters"`
	// Command is the program and its arguments, run per call with the
	// arguments (a JSON object) on stdin; its stdout is the result.
	Command []string `yaml:"command"`
	// Env names further variables of the daemon's environment the command
	// gets; none of the daemon's own.
	Env []string `yaml:"env"`
	// Timeout bounds one run. Absent or zero: 1m.
	Timeout time.Duration `yaml:"timeout"`
	// Approval asks a person before each call runs. Default true: a tool
	// runs unasked only when the file says approval: false.
	Approval *bool `yaml:"approval"`
	// Approvers may decide (Matrix user IDs); absent: the sender of the
	// message being answered.
	Approvers []string `yaml:"approvers"`
	// ExpiresIn is how long a call waits for a decision. Absent or zero:
	// 1h; at most 7 days.
	ExpiresIn time.Duration `yaml:"expires_in"`
	// Secret names arguments the card never shows.
	Secret []string `yaml:"secret"`
}

// NeedsApproval reports whether a person is asked before each call.
func (t Tool) NeedsApproval() bool { return t.Approval == nil || *t.Approval }

// Exec configures an exec backend.
type Exec struct {
	// Command is the program and its arguments; not run through a shell.
	Command []string `yaml:"command"`
	// Timeout bounds one turn, as a Go duration ("30s"). Absent or zero
	// leaves it to the back-end's default, 30s.
	Timeout time.Duration `yaml:"timeout"`
	// Env names the variables of the daemon's environment the command
	// gets beyond the few every command gets; none of the daemon's own
	// (MINDROOM_*).
	Env []string `yaml:"env"`
}

// OpenAI configures an openai backend.
type OpenAI struct {
	// BaseURL is the http(s) URL of the API, e.g. https://api.openai.com/v1.
	BaseURL string `yaml:"base_url"`
	// Model is the model name sent with each request.
	Model string `yaml:"model"`
	// APIKeyFile holds the API key; optional, for local servers.
	APIKeyFile string `yaml:"api_key_file"`
	// SystemPrompt opens every request.
	SystemPrompt string `yaml:"system_prompt"`
	// ContextMessages is how many of the last visible messages of the
	// event's conversation (its thread, or the room), up to and including
	// the question, go with each request. Absent or zero leaves it to the
	// back-end's default, 20; at most MaxContextMessages.
	ContextMessages int `yaml:"context_messages"`
	// Stream asks for a streamed answer.
	Stream bool `yaml:"stream"`
	// Vision sends the images of the conversation to the model, for
	// models that take image input.
	Vision bool `yaml:"vision"`

	// APIKey is the content of APIKeyFile.
	APIKey Secret `yaml:"-"`
}

// Load reads, validates and resolves the file at path. Relative paths in it
// are relative to its directory. lookupEnv reads the environment overrides;
// nil means os.LookupEnv.
func Load(path string, lookupEnv func(string) (string, bool)) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Err: fmt.Errorf("read config: %w", err)}
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, &Error{Err: fmt.Errorf("config directory: %w", err)}
	}
	return Parse(data, dir, lookupEnv)
}

// Parse is Load on data already read, with dir the directory relative paths
// are resolved against. lookupEnv nil means os.LookupEnv.
func Parse(data []byte, dir string, lookupEnv func(string) (string, bool)) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	cfg, err := decode(data)
	if err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	storageFromEnv := applyEnv(cfg, lookupEnv)
	if v, ok := lookupEnv(EnvDatabaseURL); ok && v != "" {
		cfg.DatabaseURL = Secret{v: v}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !storageFromEnv && !filepath.IsAbs(cfg.Storage) {
		cfg.Storage = filepath.Join(dir, cfg.Storage)
	}
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		switch {
		case a.RecoveryKeyFile == "":
			a.RecoveryKeyFile = filepath.Join(cfg.Storage, "matrix", a.Name+".recovery-key")
		case !filepath.IsAbs(a.RecoveryKeyFile):
			a.RecoveryKeyFile = filepath.Join(dir, a.RecoveryKeyFile)
		}
	}
	switch {
	case cfg.PickleKeyFile == "":
		cfg.PickleKeyFile = filepath.Join(cfg.Storage, DefaultPickleKeyFile)
	case !filepath.IsAbs(cfg.PickleKeyFile):
		cfg.PickleKeyFile = filepath.Join(dir, cfg.PickleKeyFile)
	}
	if err := cfg.readSecrets(dir); err != nil {
		return nil, err
	}
	return cfg, nil
}

func decode(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Err: errors.New("config is empty")}
		}
		return nil, &Error{Err: err}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, &Error{Err: err}
		}
		return nil, &Error{Err: fmt.Errorf("line %d: a second YAML document; the config is one document", extra.Line)}
	}
	return &cfg, nil
}

// applyEnv lets the environment win over the file. An empty variable counts
// as unset, so exporting it blank cannot erase a field. It reports whether
// the storage came from the environment, which leaves it relative to the
// working directory rather than to the file.
func applyEnv(cfg *Config, lookupEnv func(string) (string, bool)) (storageFromEnv bool) {
	for _, o := range []struct {
		name string
		dst  *string
	}{
		{EnvHomeserver, &cfg.Homeserver},
		{EnvStorage, &cfg.Storage},
		{EnvListen, &cfg.Listen},
		{EnvReplicaID, &cfg.ReplicaID},
	} {
		if v, ok := lookupEnv(o.name); ok && v != "" {
			*o.dst = v
			storageFromEnv = storageFromEnv || o.name == EnvStorage
		}
	}
	return storageFromEnv
}

// applyDefaults fills in the daemon's own optional fields left out of the
// file, before the environment and validation see them.
func (c *Config) applyDefaults() {
	if c.Storage == "" {
		c.Storage = DefaultStorage
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.KeyDeadline == 0 {
		c.KeyDeadline = DefaultKeyDeadline
	}
	if c.KeyNotice == nil {
		on := true
		c.KeyNotice = &on
	}
	if c.KeyNoticeAfter == 0 {
		c.KeyNoticeAfter = DefaultKeyNoticeAfter
	}
	if c.MediaMaxBytes == 0 {
		c.MediaMaxBytes = DefaultMediaMaxBytes
	}
	if c.ReplicaTakeover == 0 {
		c.ReplicaTakeover = DefaultReplicaTakeover
	}
	for i := range c.Agents {
		a := &c.Agents[i]
		if a.ReadReceipts == "" {
			a.ReadReceipts = DefaultReadReceipts
		}
		if a.Typing == nil {
			on := true
			a.Typing = &on
		}
		if a.ApprovalKeys.Approve == "" {
			a.ApprovalKeys.Approve = journal.DefaultApprovalKeys.Approve
		}
		if a.ApprovalKeys.Deny == "" {
			a.ApprovalKeys.Deny = journal.DefaultApprovalKeys.Deny
		}
	}
}

// validate judges the configuration as it is; it changes nothing.
func (c *Config) validate() error {
	if err := checkHTTPURL(c.Homeserver); err != nil {
		return &Error{Field: "homeserver", Err: err}
	}
	if c.KeyDeadline < time.Minute {
		return &Error{Field: "key_deadline", Err: errors.New("must be at least 1m")}
	}
	if c.KeyNoticeAfter < 0 {
		return &Error{Field: "key_notice_after", Err: errors.New("must not be negative")}
	}
	if c.MediaMaxBytes < 1 || c.MediaMaxBytes > MaxMediaMaxBytes {
		return fieldErr("media_max_bytes", "must be from 1 to %d", MaxMediaMaxBytes)
	}
	if err := c.Retention.validate("retention"); err != nil {
		return err
	}
	loopback, err := checkListen(c.Listen)
	if err != nil {
		return &Error{Field: "listen", Err: err}
	}
	if err := c.validateReplicas(); err != nil {
		return err
	}
	if len(c.Agents) == 0 {
		return fieldErr("agents", "at least one agent is required")
	}
	seen := make(map[string]int, len(c.Agents))
	for i := range c.Agents {
		a := &c.Agents[i]
		field := fmt.Sprintf("agents[%d]", i)
		// The user ID is judged on its own, before the name: NewPrincipal
		// gives the reason of one half only, and the field named must be
		// the half that reason is about.
		if !journal.ValidUserID(a.UserID) {
			return fieldErr(field+".user_id", "%q is not a full Matrix user ID", a.UserID)
		}
		if _, err := journal.NewPrincipal(a.Name, a.UserID); err != nil {
			return &Error{Field: field + ".name", Err: err}
		}
		if j, dup := seen[a.Name]; dup {
			return fieldErr(field+".name", "%q is already the name of agents[%d]", a.Name, j)
		}
		seen[a.Name] = i
		if (a.PasswordFile == "") == (a.AccessTokenFile == "") {
			return fieldErr(field+".password_file", "exactly one of password_file and access_token_file is required")
		}
		if !loopback && a.APITokenFile == "" {
			return fieldErr(field+".api_token_file", "required when listen %q is not a loopback address", c.Listen)
		}
		// The agent API is the only way to an http agent's work, and
		// without a token it refuses every request.
		if a.Backend.Type == BackendHTTP && a.APITokenFile == "" {
			return fieldErr(field+".api_token_file", "required for backend type %q", BackendHTTP)
		}
		switch k := a.ApprovalKeys; {
		case !journal.ValidReactionKey(k.Approve):
			return fieldErr(field+".approval_keys.approve", "%q is not a reaction key", k.Approve)
		case !journal.ValidReactionKey(k.Deny):
			return fieldErr(field+".approval_keys.deny", "%q is not a reaction key", k.Deny)
		case k.Approve == k.Deny:
			return fieldErr(field+".approval_keys.deny", "must differ from approve")
		}
		switch a.ReadReceipts {
		case ReceiptsOff, ReceiptsOnSettle, ReceiptsOnAnswer:
		default:
			return fieldErr(field+".read_receipts", "must be off, settle or answer, not %q", a.ReadReceipts)
		}
		if err := a.Backend.validate(field + ".backend"); err != nil {
			return err
		}
		if err := a.Retention.validate(field + ".retention"); err != nil {
			return err
		}
	}
	return nil
}

func (b Backend) validate(field string) error {
	if b.Type != BackendExec {
		switch {
		case b.Exec.Command != nil:
			return fieldErr(field+".command", "only for type %q", BackendExec)
		case b.Exec.Timeout != 0:
			return fieldErr(field+".timeout", "only for type %q", BackendExec)
		case b.Exec.Env != nil:
			return fieldErr(field+".env", "only for type %q", BackendExec)
		}
	}
	if b.Type != BackendOpenAI && b.OpenAI != (OpenAI{}) {
		return fieldErr(field+"."+firstOpenAIKey(b.OpenAI), "only for type %q", BackendOpenAI)
	}
	if b.Type != BackendOpenAI && b.Tools != nil {
		return fieldErr(field+".tools", "only for type %q", BackendOpenAI)
	}
	switch b.Type {
	case BackendEcho, BackendHTTP:
	case BackendExec:
		if len(b.Exec.Command) == 0 || b.Exec.Command[0] == "" {
			return fieldErr(field+".command", "a program and its arguments are required")
		}
		if b.Exec.Timeout < 0 {
			return fieldErr(field+".timeout", "%s is not a positive duration", b.Exec.Timeout)
		}
		for i, name := range b.Exec.Env {
			if err := checkEnvName(name); err != nil {
				return &Error{Field: fmt.Sprintf("%s.env[%d]", field, i), Err: err}
			}
		}
	case BackendOpenAI:
		if err := checkHTTPURL(b.OpenAI.BaseURL); err != nil {
			return &Error{Field: field + ".base_url", Err: err}
		}
		if b.OpenAI.Model == "" {
			return fieldErr(field+".model", "required")
		}
		if b.OpenAI.ContextMessages < 0 || b.OpenAI.ContextMessages > MaxContextMessages {
			return fieldErr(field+".context_messages", "%d is not in 0..%d", b.OpenAI.ContextMessages, MaxContextMessages)
		}
		if len(b.Tools) > MaxTools {
			return fieldErr(field+".tools", "at most %d", MaxTools)
		}
		names := map[string]int{}
		for i, t := range b.Tools {
			f := fmt.Sprintf("%s.tools[%d]", field, i)
			if err := t.validate(f); err != nil {
				return err
			}
			if j, dup := names[t.Name]; dup {
				return fieldErr(f+".name", "%q is already the name of tools[%d]", t.Name, j)
			}
			names[t.Name] = i
		}
	default:
		return fieldErr(field+".type", "%q is not one of echo, exec, http, openai", b.Type)
	}
	return nil
}

// MaxTools bounds the tools of one back-end.
const MaxTools = 64

func (t Tool) validate(field string) error {
	switch {
	case !validToolName(t.Name):
		return fieldErr(field+".name", "%q is not 1 to 64 of letters, digits, _ and -", t.Name)
	case len(t.Command) == 0 || t.Command[0] == "":
		return fieldErr(field+".command", "a program and its arguments are required")
	case t.Timeout < 0:
		return fieldErr(field+".timeout", "%s is not a positive duration", t.Timeout)
	case t.ExpiresIn < 0 || t.ExpiresIn > journal.MaxApprovalWindow:
		return fieldErr(field+".expires_in", "%s is not in 0..%s", t.ExpiresIn, journal.MaxApprovalWindow)
	case len(t.Approvers) > journal.MaxApprovers:
		return fieldErr(field+".approvers", "at most %d", journal.MaxApprovers)
	case !t.NeedsApproval() && (t.Approvers != nil || t.ExpiresIn != 0 || t.Secret != nil):
		return fieldErr(field+".approval", "approvers, expires_in and secret are for a tool that needs approval")
	}
	if t.Parameters != nil {
		if typ, _ := t.Parameters["type"].(string); typ != "object" {
			return fieldErr(field+".parameters", "must be a JSON schema of type object")
		}
		if _, err := json.Marshal(t.Parameters); err != nil {
			return fieldErr(field+".parameters", "not expressible as JSON: %v", err)
		}
	}
	for i, u := range t.Approvers {
		if !journal.ValidUserID(u) {
			return fieldErr(fmt.Sprintf("%s.approvers[%d]", field, i), "%q is not a full Matrix user ID", u)
		}
	}
	for i, name := range t.Env {
		if err := checkEnvName(name); err != nil {
			return &Error{Field: fmt.Sprintf("%s.env[%d]", field, i), Err: err}
		}
	}
	return nil
}

// validToolName accepts what chat completions APIs take as a function's
// name.
func validToolName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if r != '_' && r != '-' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// firstOpenAIKey names the first openai-only key that is set, for the error
// on a backend of another type.
func firstOpenAIKey(o OpenAI) string {
	switch {
	case o.BaseURL != "":
		return "base_url"
	case o.Model != "":
		return "model"
	case o.APIKeyFile != "":
		return "api_key_file"
	case o.SystemPrompt != "":
		return "system_prompt"
	case o.ContextMessages != 0:
		return "context_messages"
	case o.Vision:
		return "vision"
	default:
		return "stream"
	}
}

// checkEnvName accepts the name of an environment variable, letters,
// digits and underscores not starting with a digit, that is not one of the
// daemon's own: those hold its secrets, which no command may see.
func checkEnvName(name string) error {
	if name == "" {
		return errors.New("empty variable name")
	}
	for i, r := range name {
		if r != '_' && (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') && (i == 0 || r < '0' || r > '9') {
			return fmt.Errorf("%q is not a variable name", name)
		}
	}
	if strings.HasPrefix(name, envPrefix) {
		return fmt.Errorf("%s is the daemon's own, never a command's", name)
	}
	return nil
}

// checkHTTPURL refuses a value that is not an http(s) URL. A URL may carry
// a password, so the error shows it redacted, and not at all when it does
// not parse: the parser's own message quotes it whole.
func checkHTTPURL(s string) error {
	if s == "" {
		return errors.New("required")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a valid http(s) URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", u.Redacted())
	}
	return nil
}

// checkDatabaseURL accepts a postgres:// or postgresql:// URL with a host.
// Its errors never quote the URL, which holds a password.
func checkDatabaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || (u.Host == "" && u.Query().Get("host") == "") {
		return errors.New("not a postgres:// URL with a host")
	}
	return nil
}

// checkListen validates host:port and reports whether the host is loopback.
// A host name other than localhost counts as not loopback: what it resolves
// to is not known until it is bound.
func checkListen(s string) (loopback bool, err error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false, fmt.Errorf("%q is not host:port", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return false, fmt.Errorf("%q has no valid port", s)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

func (c *Config) validateReplicas() error {
	switch {
	case c.Replicas != "" && c.Replicas != ReplicasAuto:
		return fieldErr("replicas", "%q is not a replica mode; the one there is is %q", c.Replicas, ReplicasAuto)
	case c.ReplicaTakeover < 2*time.Second:
		return fieldErr("replica_takeover", "must be at least 2s")
	case c.ReplicaURL != "":
		if err := checkHTTPURL(c.ReplicaURL); err != nil {
			return &Error{Field: "replica_url", Err: err}
		}
	}
	if len(c.ReplicaID) > MaxReplicaID || strings.ContainsFunc(c.ReplicaID, unicode.IsControl) {
		return fieldErr("replica_id", "must be at most %d bytes, none of them control characters", MaxReplicaID)
	}
	if c.ReplicaLeaseCheck < 0 {
		return fieldErr("replica_lease_check", "must not be negative")
	}
	return nil
}

// readSecrets resolves the secret files' paths against dir and reads them.
func (c *Config) readSecrets(dir string) error {
	if c.DatabaseURLFile != "" && !c.DatabaseURL.IsSet() {
		if !filepath.IsAbs(c.DatabaseURLFile) {
			c.DatabaseURLFile = filepath.Join(dir, c.DatabaseURLFile)
		}
		v, err := readSecret(c.DatabaseURLFile)
		if err != nil {
			return &Error{Field: "database_url_file", Err: err}
		}
		c.DatabaseURL = v
	}
	if c.DatabaseURL.IsSet() {
		if err := checkDatabaseURL(c.DatabaseURL.Reveal()); err != nil {
			field := "database_url_file"
			if c.DatabaseURLFile == "" {
				field = EnvDatabaseURL
			}
			return &Error{Field: field, Err: err}
		}
	}
	if c.Replicas == ReplicasAuto && !c.DatabaseURL.IsSet() {
		// Replicas share their journal: only PostgreSQL is shared.
		return fieldErr("replicas", "replicas: auto needs the journal on PostgreSQL (database_url_file)")
	}
	for i := range c.Agents {
		a := &c.Agents[i]
		field := fmt.Sprintf("agents[%d]", i)
		for _, s := range []struct {
			key  string
			path *string
			dst  *Secret
		}{
			{"password_file", &a.PasswordFile, &a.Password},
			{"access_token_file", &a.AccessTokenFile, &a.AccessToken},
			{"api_token_file", &a.APITokenFile, &a.APIToken},
			{"backend.api_key_file", &a.Backend.OpenAI.APIKeyFile, &a.Backend.OpenAI.APIKey},
		} {
			if *s.path == "" {
				continue
			}
			if !filepath.IsAbs(*s.path) {
				*s.path = filepath.Join(dir, *s.path)
			}
			v, err := readSecret(*s.path)
			if err != nil {
				return &Error{Field: field + "." + s.key, Err: err}
			}
			*s.dst = v
		}
	}
	// A bearer token names its agent: two agents sharing one would each
	// get the other's requests.
	for i := range c.Agents {
		for j := range i {
			if t := c.Agents[i].APIToken; t.IsSet() && t.Reveal() == c.Agents[j].APIToken.Reveal() {
				return &Error{Field: fmt.Sprintf("agents[%d].api_token_file", i),
					Err: fmt.Errorf("the same token as agents[%d]'s; each agent needs its own", j)}
			}
		}
	}
	return nil
}

// readSecret reads a secret file, dropping one trailing newline (editors and
// `echo` add one). The errors name the path, never the content.
func readSecret(path string) (Secret, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Secret{}, fmt.Errorf("read secret: %w", err)
	}
	s := string(data)
	if t, ok := strings.CutSuffix(s, "\r\n"); ok {
		s = t
	} else {
		s = strings.TrimSuffix(s, "\n")
	}
	if s == "" {
		return Secret{}, fmt.Errorf("secret file %s is empty", path)
	}
	return Secret{v: s}, nil
}
