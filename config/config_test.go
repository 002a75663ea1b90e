package config_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
)

// noEnv is an empty environment, so no test depends on the machine's.
func noEnv(string) (string, bool) { return "", false }

// envOf is an environment holding exactly vars.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

// The secrets written by writeSecrets; no error or printout may contain them.
const (
	password    = "pw-5f1c9e-never-printed"
	accessToken = "at-8b27d4-never-printed"
	apiToken    = "api-3e90aa-never-printed"
	apiKey      = "key-c41d07-never-printed"
)

var allSecrets = []string{password, accessToken, apiToken, apiKey}

// writeSecrets fills dir/secrets with one file per secret, plus an empty one.
func writeSecrets(t *testing.T, dir string) {
	t.Helper()
	files := map[string]string{
		"password":     password + "\n",
		"access-token": accessToken + "\n",
		"api-token":    apiToken + "\n",
		"api-key":      apiKey + "\n",
		"empty":        "\n",
	}
	if err := os.MkdirAll(filepath.Join(dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, "secrets", name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func mustParse(t *testing.T, doc, dir string, env func(string) (string, bool)) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(doc), dir, env)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

func TestTheDocumentedShapeLoadsAgainstItsOwnDirectory(t *testing.T) {
	cfg, err := config.Load(filepath.Join("testdata", "mindroom.yaml"), noEnv)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	dir, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Homeserver, "http://127.0.0.1:8008"; got != want {
		t.Errorf("Homeserver=%q, want %q", got, want)
	}
	if got, want := cfg.Storage, filepath.Join(dir, "mindroom_data"); got != want {
		t.Errorf("Storage=%q, want %q", got, want)
	}
	if got, want := cfg.Listen, "127.0.0.1:8787"; got != want {
		t.Errorf("Listen=%q, want %q", got, want)
	}
	if got := len(cfg.Agents); got != 1 {
		t.Fatalf("len(Agents)=%d, want 1", got)
	}
	a := cfg.Agents[0]
	if got, want := a.Principal(), (journal.Principal{Agent: "echo", UserID: "@echo:localhost"}); got != want {
		t.Errorf("Principal=%v, want %v", got, want)
	}
	if got, want := a.PasswordFile, filepath.Join(dir, "secrets", "echo.password"); got != want {
		t.Errorf("PasswordFile=%q, want %q", got, want)
	}
	if got, want := a.Password.Reveal(), "testdata-password"; got != want {
		t.Errorf("Password=%q, want %q", got, want)
	}
	if got, want := a.APIToken.Reveal(), "testdata-api-token"; got != want {
		t.Errorf("APIToken=%q, want %q", got, want)
	}
	if a.AccessTokenFile != "" || a.AccessToken.IsSet() {
		t.Errorf("AccessToken set without access_token_file: %q", a.AccessTokenFile)
	}
	if !a.AutoJoin {
		t.Error("AutoJoin=false, want true")
	}
	if got, want := a.Backend.Type, config.BackendEcho; got != want {
		t.Errorf("Backend.Type=%q, want %q", got, want)
	}
}

func TestOmittedStorageAndListenTakeTheirDefaults(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	cfg := mustParse(t, `
homeserver: https://matrix.example.org
agents:
  - {name: echo, user_id: "@echo:example.org", password_file: secrets/password, backend: {type: echo}}
`, dir, noEnv)
	if got, want := cfg.Storage, filepath.Join(dir, "mindroom_data"); got != want {
		t.Errorf("Storage=%q, want %q", got, want)
	}
	if got, want := cfg.Listen, config.DefaultListen; got != want {
		t.Errorf("Listen=%q, want %q", got, want)
	}
	if got, want := cfg.MediaMaxBytes, int64(config.DefaultMediaMaxBytes); got != want {
		t.Errorf("MediaMaxBytes=%d, want %d", got, want)
	}
	if a := cfg.Agents[0]; a.ReadReceipts != config.ReceiptsOnSettle || a.Typing == nil || !*a.Typing {
		t.Errorf("read_receipts=%q typing=%v, want settle and true", a.ReadReceipts, a.Typing)
	}
}

func TestTheEnvironmentWinsOverTheFile(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	doc := `
homeserver: http://127.0.0.1:8008
storage: /var/lib/from-file
listen: 127.0.0.1:8787
agents:
  - {name: echo, user_id: "@echo:localhost", password_file: secrets/password, api_token_file: secrets/api-token, backend: {type: echo}}
`
	t.Run("Set", func(t *testing.T) {
		cfg := mustParse(t, doc, dir, envOf(map[string]string{
			"MINDROOM_HOMESERVER": "https://env.example.org",
			"MINDROOM_STORAGE":    "from-env/data",
			"MINDROOM_LISTEN":     "0.0.0.0:9000",
		}))
		if got, want := cfg.Homeserver, "https://env.example.org"; got != want {
			t.Errorf("Homeserver=%q, want %q", got, want)
		}
		// Relative to the working directory, as on a command line, not to the file.
		if got, want := cfg.Storage, "from-env/data"; got != want {
			t.Errorf("Storage=%q, want %q", got, want)
		}
		if got, want := cfg.Listen, "0.0.0.0:9000"; got != want {
			t.Errorf("Listen=%q, want %q", got, want)
		}
	})
	t.Run("EmptyIsUnset", func(t *testing.T) {
		cfg := mustParse(t, doc, dir, envOf(map[string]string{
			"MINDROOM_HOMESERVER": "", "MINDROOM_STORAGE": "", "MINDROOM_LISTEN": "",
		}))
		if got, want := cfg.Homeserver, "http://127.0.0.1:8008"; got != want {
			t.Errorf("Homeserver=%q, want %q", got, want)
		}
		if got, want := cfg.Storage, "/var/lib/from-file"; got != want {
			t.Errorf("Storage=%q, want %q", got, want)
		}
	})
	t.Run("OverriddenValueIsValidated", func(t *testing.T) {
		_, err := config.Parse([]byte(doc), dir, envOf(map[string]string{"MINDROOM_HOMESERVER": "matrix.example.org"}))
		if got, want := fieldOf(t, err), "homeserver"; got != want {
			t.Errorf("Field=%q, want %q (err %v)", got, want, err)
		}
	})
}

func TestRelativePathsResolveAgainstTheConfigDirectory(t *testing.T) {
	root := t.TempDir()
	confDir := filepath.Join(root, "etc")
	writeSecrets(t, confDir)
	elsewhere := filepath.Join(root, "elsewhere")
	writeSecrets(t, elsewhere)
	doc := fmt.Sprintf(`
homeserver: http://127.0.0.1:8008
storage: ../state
agents:
  - name: helper
    user_id: "@helper:localhost"
    access_token_file: secrets/access-token
    api_token_file: %s
    backend: {type: openai, base_url: "http://127.0.0.1:11434/v1", model: m, api_key_file: ./secrets/api-key}
`, filepath.Join(elsewhere, "secrets", "api-token"))
	path := filepath.Join(confDir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	// The working directory stays the package's: nothing may resolve against it.
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	a := cfg.Agents[0]
	for _, c := range []struct{ name, got, want string }{
		{"Storage", cfg.Storage, filepath.Join(root, "state")},
		{"AccessTokenFile", a.AccessTokenFile, filepath.Join(confDir, "secrets", "access-token")},
		{"APITokenFile", a.APITokenFile, filepath.Join(elsewhere, "secrets", "api-token")},
		{"APIKeyFile", a.Backend.OpenAI.APIKeyFile, filepath.Join(confDir, "secrets", "api-key")},
		{"AccessToken", a.AccessToken.Reveal(), accessToken},
		{"APIToken", a.APIToken.Reveal(), apiToken},
		{"APIKey", a.Backend.OpenAI.APIKey.Reveal(), apiKey},
	} {
		if c.got != c.want {
			t.Errorf("%s=%q, want %q", c.name, c.got, c.want)
		}
	}
}

func TestBackendSettingsAreKeptAndTheKeysLeftOutStayZeroForTheBackEnd(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	cfg := mustParse(t, `
homeserver: http://127.0.0.1:8008
agents:
  - name: slow
    user_id: "@slow:localhost"
    password_file: secrets/password
    backend: {type: exec, command: [./bot, --flag], timeout: 2m30s, env: [BOT_API_KEY, LC_ALL]}
  - name: quick
    user_id: "@quick:localhost"
    password_file: secrets/password
    backend: {type: exec, command: [./bot]}
  - name: llm
    user_id: "@llm:localhost"
    password_file: secrets/password
    backend:
      type: openai
      base_url: https://api.example.org/v1
      model: small
      system_prompt: Be brief.
      stream: true
  - name: hooked
    user_id: "@hooked:localhost"
    password_file: secrets/password
    api_token_file: secrets/api-token
    backend: {type: http}
  - name: tooled
    user_id: "@tooled:localhost"
    password_file: secrets/password
    backend:
      type: openai
      base_url: https://api.example.org/v1
      model: small
      tools:
        - name: send_mail
          command: [./mail]
          parameters:
            type: object
            properties: {to: {type: string}}
          approvers: ["@ops:localhost"]
          expires_in: 30m
        - {name: lookup, command: [./lookup], approval: false}
`, dir, noEnv)
	if got, want := cfg.Agents[0].Backend.Exec.Timeout, 150*time.Second; got != want {
		t.Errorf("agents[0] timeout=%v, want %v", got, want)
	}
	if got, want := strings.Join(cfg.Agents[0].Backend.Exec.Command, " "), "./bot --flag"; got != want {
		t.Errorf("agents[0] command=%q, want %q", got, want)
	}
	if got, want := strings.Join(cfg.Agents[0].Backend.Exec.Env, " "), "BOT_API_KEY LC_ALL"; got != want {
		t.Errorf("agents[0] env=%q, want %q", got, want)
	}
	// The back-ends own their defaults: left out, a key stays zero.
	if b := cfg.Agents[1].Backend.Exec; b.Timeout != 0 || b.Env != nil {
		t.Errorf("agents[1] timeout=%v env=%q, want both left out", b.Timeout, b.Env)
	}
	o := cfg.Agents[2].Backend.OpenAI
	if o.ContextMessages != 0 {
		t.Errorf("context_messages=%d, want it left out", o.ContextMessages)
	}
	if o.BaseURL != "https://api.example.org/v1" || o.Model != "small" || o.SystemPrompt != "Be brief." || !o.Stream || o.APIKey.IsSet() {
		t.Errorf("openai=%+v", o)
	}
	if got, want := cfg.Agents[3].Backend.Type, config.BackendHTTP; got != want {
		t.Errorf("agents[3] type=%q, want %q", got, want)
	}
	tools := cfg.Agents[4].Backend.Tools
	if len(tools) != 2 {
		t.Fatalf("tools = %+v, want 2", tools)
	}
	// A tool needs approval unless the file says otherwise.
	if m := tools[0]; !m.NeedsApproval() || m.ExpiresIn != 30*time.Minute || len(m.Approvers) != 1 || m.Timeout != 0 {
		t.Errorf("tools[0] = %+v", m)
	}
	if props, _ := tools[0].Parameters["properties"].(map[string]any); props["to"] == nil {
		t.Errorf("tools[0] parameters = %v, want the schema as written", tools[0].Parameters)
	}
	if tools[1].NeedsApproval() {
		t.Errorf("tools[1] needs approval, but the file says approval: false")
	}
	// Retention is off unless set, the file's unless the agent has its own.
	if r := cfg.RetentionOf(cfg.Agents[0]); r != nil {
		t.Errorf("retention = %+v, want none", r)
	}
}

func TestAnAgentsRetentionReplacesTheFilesWhole(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	cfg := mustParse(t, `
homeserver: http://127.0.0.1:8008
retention: {bodies: 720h, payloads: 168h, identities: 2160h}
agents:
  - name: kept
    user_id: "@kept:localhost"
    password_file: secrets/password
    backend: {type: echo}
  - name: brief
    user_id: "@brief:localhost"
    password_file: secrets/password
    backend: {type: echo}
    retention: {bodies: 24h, identities: 24h, interval: 10m}
`, dir, noEnv)
	kept, brief := cfg.RetentionOf(cfg.Agents[0]), cfg.RetentionOf(cfg.Agents[1])
	if kept == nil || kept.Policy() != (journal.RetentionPolicy{Bodies: 720 * time.Hour, Payloads: 168 * time.Hour, Identities: 2160 * time.Hour}) {
		t.Errorf("the file's retention = %+v", kept)
	}
	if brief == nil || brief.Payloads != 0 || brief.Bodies != 24*time.Hour || brief.Interval != 10*time.Minute {
		t.Errorf("the agent's own retention = %+v, want it whole, the file's payloads not mixed in", brief)
	}
}

// fieldOf asserts err is a configuration error and returns its field.
func fieldOf(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		t.Fatal("err=nil, want a configuration error")
	}
	if !errors.Is(err, config.ErrConfig) {
		t.Errorf("errors.Is(%v, ErrConfig)=false", err)
	}
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err=%T %v, want *config.Error", err, err)
	}
	for _, s := range allSecrets {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error %q contains a secret", err)
		}
	}
	return ce.Field
}

func TestEveryInvalidFieldIsRefusedByName(t *testing.T) {
	const hs = "homeserver: http://127.0.0.1:8008\n"
	const head = hs + "agents:\n  - name: echo\n    user_id: \"@echo:localhost\"\n"
	const pw = "    password_file: secrets/password\n"
	const echo = "    backend: {type: echo}\n"
	const oaTools = "    backend: {type: openai, base_url: \"http://h/v1\", model: m, tools: ["
	for _, c := range []struct {
		name, doc, field, msg string
	}{
		{"HomeserverMissing", "agents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, backend: {type: echo}}\n", "homeserver", "required"},
		{"HomeserverNotHTTP", "homeserver: ftp://127.0.0.1\n" + head[len(hs):] + pw + echo, "homeserver", `"ftp://127.0.0.1" is not an http(s) URL`},
		{"HomeserverNoHost", "homeserver: matrix.example.org\n" + head[len(hs):] + pw + echo, "homeserver", "is not an http(s) URL"},
		{"ListenNoPort", "listen: 127.0.0.1\n" + head + pw + echo, "listen", `"127.0.0.1" is not host:port`},
		{"ListenBadPort", "listen: 127.0.0.1:99999\n" + head + pw + echo, "listen", "no valid port"},
		{"NoAgents", hs + "agents: []\n", "agents", "at least one agent"},
		{"AgentsAbsent", hs, "agents", "at least one agent"},
		{"NameInvalid", hs + "agents:\n  - {name: echo bot, user_id: \"@echo:localhost\", password_file: secrets/password, backend: {type: echo}}\n", "agents[0].name", `"echo bot"`},
		{"NameMissing", hs + "agents:\n  - {user_id: \"@echo:localhost\", password_file: secrets/password, backend: {type: echo}}\n", "agents[0].name", "agent name"},
		{"UserIDInvalid", hs + "agents:\n  - {name: echo, user_id: \"@echo\", password_file: secrets/password, backend: {type: echo}}\n", "agents[0].user_id", `"@echo" is not a full Matrix user ID`},
		{"NameDuplicate", head + pw + echo + "  - {name: echo, user_id: \"@other:localhost\", password_file: secrets/password, backend: {type: echo}}\n", "agents[1].name", `"echo" is already the name of agents[0]`},
		{"NoCredential", head + echo, "agents[0].password_file", "exactly one of password_file and access_token_file"},
		{"BothCredentials", head + pw + "    access_token_file: secrets/access-token\n" + echo, "agents[0].password_file", "exactly one of"},
		{"BackendTypeMissing", head + pw + "    backend: {}\n", "agents[0].backend.type", `"" is not one of echo, exec, http, openai`},
		{"BackendTypeUnknown", head + pw + "    backend: {type: gpt}\n", "agents[0].backend.type", `"gpt" is not one of`},
		{"ExecNoCommand", head + pw + "    backend: {type: exec}\n", "agents[0].backend.command", "required"},
		{"ExecEmptyProgram", head + pw + "    backend: {type: exec, command: [\"\"]}\n", "agents[0].backend.command", "required"},
		{"HTTPWithoutAPIToken", head + pw + "    backend: {type: http}\n", "agents[0].api_token_file", `required for backend type "http"`},
		{"ExecEnvNamesTheDaemonsOwn", head + pw + "    backend: {type: exec, command: [x], env: [HOME_DIR, MINDROOM_DATABASE_URL]}\n", "agents[0].backend.env[1]", "MINDROOM_DATABASE_URL is the daemon's own"},
		{"ExecEnvNotAName", head + pw + "    backend: {type: exec, command: [x], env: [\"KEY=value\"]}\n", "agents[0].backend.env[0]", `"KEY=value" is not a variable name`},
		{"ExecEnvEmptyName", head + pw + "    backend: {type: exec, command: [x], env: [\"\"]}\n", "agents[0].backend.env[0]", "empty variable name"},
		{"ExecEnvStartsWithADigit", head + pw + "    backend: {type: exec, command: [x], env: [1KEY]}\n", "agents[0].backend.env[0]", `"1KEY" is not a variable name`},
		{"EnvOnEcho", head + pw + "    backend: {type: echo, env: [KEY]}\n", "agents[0].backend.env", `only for type "exec"`},
		{"ExecNegativeTimeout", head + pw + "    backend: {type: exec, command: [x], timeout: -1s}\n", "agents[0].backend.timeout", "-1s is not a positive duration"},
		{"CommandOnEcho", head + pw + "    backend: {type: echo, command: [x]}\n", "agents[0].backend.command", `only for type "exec"`},
		{"TimeoutOnHTTP", head + pw + "    api_token_file: secrets/api-token\n    backend: {type: http, timeout: 5s}\n", "agents[0].backend.timeout", `only for type "exec"`},
		{"ModelOnExec", head + pw + "    backend: {type: exec, command: [x], model: m}\n", "agents[0].backend.model", `only for type "openai"`},
		{"StreamOnEcho", head + pw + "    backend: {type: echo, stream: true}\n", "agents[0].backend.stream", `only for type "openai"`},
		{"VisionOnEcho", head + pw + "    backend: {type: echo, vision: true}\n", "agents[0].backend.vision", `only for type "openai"`},
		{"ApprovalKeysAlike", head + pw + "    approval_keys: {approve: \"👍\", deny: \"👍\"}\n" + echo, "agents[0].approval_keys.deny", "must differ from approve"},
		{"ApprovalKeyEmptyOfText", head + pw + "    approval_keys: {approve: \" \"}\n" + echo, "agents[0].approval_keys.approve", "is not a reaction key"},
		{"ReadReceiptsUnknown", head + pw + "    read_receipts: always\n" + echo, "agents[0].read_receipts", `must be off, settle or answer, not "always"`},
		{"MediaCapNegative", "media_max_bytes: -1\n" + head + pw + echo, "media_max_bytes", "must be from 1 to"},
		{"MediaCapHuge", "media_max_bytes: 2147483648\n" + head + pw + echo, "media_max_bytes", "must be from 1 to"},
		{"OpenAINoBaseURL", head + pw + "    backend: {type: openai, model: m}\n", "agents[0].backend.base_url", "required"},
		{"OpenAIBadBaseURL", head + pw + "    backend: {type: openai, base_url: api.example.org, model: m}\n", "agents[0].backend.base_url", "is not an http(s) URL"},
		{"OpenAINoModel", head + pw + "    backend: {type: openai, base_url: \"http://h/v1\"}\n", "agents[0].backend.model", "required"},
		{"OpenAINegativeContext", head + pw + "    backend: {type: openai, base_url: \"http://h/v1\", model: m, context_messages: -3}\n", "agents[0].backend.context_messages", "-3 is not in 0..1000"},
		{"ToolsOnExec", head + pw + "    backend: {type: exec, command: [x], tools: [{name: t, command: [x]}]}\n", "agents[0].backend.tools", `only for type "openai"`},
		{"ToolNameInvalid", head + pw + oaTools + "{name: \"send mail\", command: [x]}]}\n", "agents[0].backend.tools[0].name", `"send mail" is not 1 to 64`},
		{"ToolNameDuplicate", head + pw + oaTools + "{name: t, command: [x]}, {name: t, command: [y]}]}\n", "agents[0].backend.tools[1].name", `"t" is already the name of tools[0]`},
		{"ToolNoCommand", head + pw + oaTools + "{name: t}]}\n", "agents[0].backend.tools[0].command", "required"},
		{"ToolApproverNotAUser", head + pw + oaTools + "{name: t, command: [x], approvers: [bob]}]}\n", "agents[0].backend.tools[0].approvers[0]", `"bob" is not a full Matrix user ID`},
		{"ToolExpiryBeyondTheWindow", head + pw + oaTools + "{name: t, command: [x], expires_in: 200h}]}\n", "agents[0].backend.tools[0].expires_in", "is not in 0..168h0m0s"},
		{"ToolParametersNotAnObject", head + pw + oaTools + "{name: t, command: [x], parameters: {type: string}}]}\n", "agents[0].backend.tools[0].parameters", "type object"},
		{"ToolApproversWithoutApproval", head + pw + oaTools + "{name: t, command: [x], approval: false, approvers: [\"@b:l\"]}]}\n", "agents[0].backend.tools[0].approval", "for a tool that needs approval"},
		{"ToolEnvTheDaemonsOwn", head + pw + oaTools + "{name: t, command: [x], env: [MINDROOM_DATABASE_URL]}]}\n", "agents[0].backend.tools[0].env[0]", "the daemon's own"},
		{"RetentionIdentitiesTooShort", "retention: {identities: 1h}\n" + head + pw + echo, "retention", "shorter than 24h0m0s"},
		{"RetentionBodiesOutliveIdentities", "retention: {bodies: 720h, identities: 48h}\n" + head + pw + echo, "retention", "an identity must outlive what it identifies"},
		{"RetentionNegativeInterval", head + pw + echo + "    retention: {bodies: 1h, interval: -1m}\n", "agents[0].retention.interval", "-1m0s is not a positive duration"},
		{"RetentionNegativeWindow", head + pw + echo + "    retention: {turns: -1h}\n", "agents[0].retention", "is negative"},
		{"OpenAIContextBeyondOnePage", head + pw + "    backend: {type: openai, base_url: \"http://h/v1\", model: m, context_messages: 5000}\n", "agents[0].backend.context_messages", "5000 is not in 0..1000"},
		{"WildcardListenWithoutToken", "listen: 0.0.0.0:8787\n" + head + pw + echo, "agents[0].api_token_file", `required when listen "0.0.0.0:8787" is not a loopback address`},
		{"EmptyHostListenWithoutToken", "listen: \":8787\"\n" + head + pw + echo, "agents[0].api_token_file", "not a loopback address"},
		{"IPv6ListenWithoutToken", "listen: \"[::]:8787\"\n" + head + pw + echo, "agents[0].api_token_file", "not a loopback address"},
		{"HostnameListenWithoutToken", "listen: bot.example.org:8787\n" + head + pw + "    api_token_file: secrets/api-token\n" + echo +
			"  - {name: two, user_id: \"@two:localhost\", password_file: secrets/password, backend: {type: echo}}\n", "agents[1].api_token_file", "not a loopback address"},
		{"ReplicasUnknown", "replicas: manual\n" + head + pw + echo, "replicas", `"manual" is not a replica mode`},
		{"ReplicasWithoutPostgreSQL", "replicas: auto\n" + head + pw + echo, "replicas", "needs the journal on PostgreSQL"},
		{"ReplicaTakeoverTooShort", "replica_takeover: 1s\n" + head + pw + echo, "replica_takeover", "at least 2s"},
		{"ReplicaURLNotHTTP", "replica_url: 10.0.0.1:8787\n" + head + pw + echo, "replica_url", "not a valid http(s) URL"},
		{"ReplicaIDTooLong", "replica_id: " + strings.Repeat("r", 46) + "\n" + head + pw + echo, "replica_id", "at most 45 bytes"},
		{"ReplicaLeaseCheckNegative", "replica_lease_check: -1s\n" + head + pw + echo, "replica_lease_check", "must not be negative"},
		{"PasswordFileMissing", head + "    password_file: secrets/nope\n" + echo, "agents[0].password_file", "secrets/nope: no such file"},
		{"PasswordFileEmpty", head + "    password_file: secrets/empty\n" + echo, "agents[0].password_file", "secrets/empty is empty"},
		{"AccessTokenFileIsADirectory", head + "    access_token_file: secrets\n" + echo, "agents[0].access_token_file", "read secret"},
		{"APITokenFileMissing", head + pw + "    api_token_file: secrets/nope\n" + echo, "agents[0].api_token_file", "no such file"},
		{"APIKeyFileEmptyAfterOthersRead", head + pw + "    api_token_file: secrets/api-token\n    backend: {type: openai, base_url: \"http://h/v1\", model: m, api_key_file: secrets/empty}\n", "agents[0].backend.api_key_file", "is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSecrets(t, dir)
			cfg, err := config.Parse([]byte(c.doc), dir, noEnv)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			if got := fieldOf(t, err); got != c.field {
				t.Errorf("Field=%q, want %q (err %v)", got, c.field, err)
			}
			if !strings.HasPrefix(err.Error(), c.field+": ") || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("err=%q, want %q naming %q", err, c.msg, c.field)
			}
		})
	}
}

func TestALoopbackListenNeedsNoAPIToken(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	for _, listen := range []string{"127.0.0.1:8787", "127.9.9.9:1", "localhost:8787", "[::1]:8787"} {
		doc := "listen: \"" + listen + "\"\nhomeserver: http://127.0.0.1:8008\nagents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, backend: {type: echo}}\n"
		if _, err := config.Parse([]byte(doc), dir, noEnv); err != nil {
			t.Errorf("listen %s: %v", listen, err)
		}
	}
	doc := "listen: 0.0.0.0:8787\nhomeserver: http://127.0.0.1:8008\nagents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, api_token_file: secrets/api-token, backend: {type: echo}}\n"
	if _, err := config.Parse([]byte(doc), dir, noEnv); err != nil {
		t.Errorf("0.0.0.0 with a token: %v", err)
	}
}

func TestAnUnknownKeyIsRefusedWithItsNameAndLine(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	for _, c := range []struct{ name, doc, want string }{
		{"TopLevel", "homeserver: http://h\nhomeservr: http://h\n", "line 2: field homeservr not found"},
		{"InAgent", "homeserver: http://h\nagents:\n  - name: e\n    password: hunter2\n", "line 4: field password not found"},
		{"InBackend", "homeserver: http://h\nagents:\n  - name: e\n    backend:\n      type: exec\n      comand: [x]\n", "line 6: field comand not found"},
		{"SecretFieldNotAKey", "homeserver: http://h\nagents:\n  - name: e\n    Password: x\n", "line 4: field Password not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.doc), dir, noEnv)
			if got := fieldOf(t, err); got != "" {
				t.Errorf("Field=%q, want the whole file", got)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("err=%q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestTheFileIsOneWellTypedDocument(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	const valid = "homeserver: http://h\nagents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, backend: {type: echo}}\n"
	for _, c := range []struct{ name, doc, want string }{
		{"Empty", "", "config is empty"},
		{"OnlyAComment", "# nothing yet\n", "config is empty"},
		{"SecondDocument", valid + "---\nhomeserver: http://other\n", "line 4: a second YAML document"},
		{"SecondDocumentMalformed", valid + "---\n[\n", "yaml:"},
		{"NotAMapping", "- a\n- b\n", "cannot unmarshal"},
		{"DuplicateKey", valid + "homeserver: http://again\n", `"homeserver" already defined`},
		{"TimeoutWithoutUnit", "homeserver: http://h\nagents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, backend: {type: exec, command: [x], timeout: 30}}\n", "into time.Duration"},
		{"TimeoutNotADuration", "homeserver: http://h\nagents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/password, backend: {type: exec, command: [x], timeout: soon}}\n", "into time.Duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.doc), dir, noEnv)
			fieldOf(t, err)
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("err=%q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestLoadingAMissingFileIsAConfigurationError(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "mindroom.yaml"), noEnv)
	fieldOf(t, err)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist)=false", err)
	}
}

func TestASecretFileLosesExactlyOneTrailingNewline(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ content, want string }{
		{"tok", "tok"},
		{"tok\n", "tok"},
		{"tok\r\n", "tok"},
		{"tok\n\n", "tok\n"},
		{" tok \n", " tok "},
	} {
		if err := os.WriteFile(filepath.Join(dir, "token"), []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := mustParse(t, "homeserver: http://h\nagents:\n  - {name: e, user_id: \"@e:l\", access_token_file: token, backend: {type: echo}}\n", dir, noEnv)
		if got := cfg.Agents[0].AccessToken.Reveal(); got != c.want {
			t.Errorf("file %q: token=%q, want %q", c.content, got, c.want)
		}
	}
}

func TestSecretsAreNeverPrinted(t *testing.T) {
	dir := t.TempDir()
	writeSecrets(t, dir)
	cfg := mustParse(t, `
homeserver: http://127.0.0.1:8008
agents:
  - name: one
    user_id: "@one:localhost"
    password_file: secrets/password
    api_token_file: secrets/api-token
    backend: {type: openai, base_url: "http://h/v1", model: m, api_key_file: secrets/api-key}
  - name: two
    user_id: "@two:localhost"
    access_token_file: secrets/access-token
    backend: {type: echo}
`, dir, noEnv)
	jsonOut, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	yamlOut, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Agents[0].Password
	outputs := map[string]string{
		"v+v#v":   fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg),
		"value":   fmt.Sprintf("%v %+v %#v", *cfg, *cfg, *cfg),
		"agents":  fmt.Sprintf("%v %+v %#v", cfg.Agents, cfg.Agents, cfg.Agents),
		"verbs":   fmt.Sprintf("%s %q %x %X %d %T %10v", s, s, s, s, s, s, s),
		"print":   fmt.Sprint(s) + fmt.Sprintln(s),
		"json":    string(jsonOut),
		"yaml":    string(yamlOut),
		"methods": s.String() + s.GoString(),
	}
	for name, out := range outputs {
		for _, secret := range allSecrets {
			if strings.Contains(out, secret) {
				t.Errorf("%s output contains a secret: %s", name, out)
			}
		}
	}
	if !strings.Contains(outputs["v+v#v"], "[redacted]") || !strings.Contains(outputs["json"], `"[redacted]"`) {
		t.Errorf("a set secret should print as a placeholder: %s", outputs["v+v#v"])
	}
	// The values are there for the one caller that asks.
	a, b := cfg.Agents[0], cfg.Agents[1]
	for _, c := range []struct{ got, want string }{
		{a.Password.Reveal(), password},
		{a.APIToken.Reveal(), apiToken},
		{a.Backend.OpenAI.APIKey.Reveal(), apiKey},
		{b.AccessToken.Reveal(), accessToken},
	} {
		if c.got != c.want {
			t.Errorf("Reveal=%q, want %q", c.got, c.want)
		}
	}
}

func TestTwoAgentsCannotShareAnAPIToken(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"a.pw": "pw-a", "b.pw": "pw-b", "a.tok": "same-token", "b.tok": "same-token\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	yaml := `homeserver: http://127.0.0.1:8008
agents:
  - name: a
    user_id: "@a:localhost"
    password_file: a.pw
    api_token_file: a.tok
    backend: {type: http}
  - name: b
    user_id: "@b:localhost"
    password_file: b.pw
    api_token_file: b.tok
    backend: {type: http}
`
	_, err := config.Parse([]byte(yaml), dir, func(string) (string, bool) { return "", false })
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Field != "agents[1].api_token_file" {
		t.Fatalf("err = %v, want a refusal naming agents[1].api_token_file", err)
	}
	if strings.Contains(err.Error(), "same-token") {
		t.Fatalf("the error shows the token: %v", err)
	}
}

func TestADatabaseURLComesFromItsFileOrTheEnvironmentAndIsNeverPrinted(t *testing.T) {
	const (
		fileURL = "postgres://mindroom:db-pw-71e0c2-never-printed@127.0.0.1:5432/journal"
		envURL  = "postgresql://mindroom:env-pw-2b9d55-never-printed@db.internal/journal?sslmode=require"
	)
	dir := t.TempDir()
	writeSecrets(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "secrets", "pg.url"), []byte(fileURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets", "bad.url"), []byte("mysql://u:bad-pw-0c1f@h/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := func(file string) string {
		return `
homeserver: http://127.0.0.1:8008
database_url_file: ` + file + `
agents:
  - name: one
    user_id: "@one:localhost"
    password_file: secrets/password
    backend: {type: echo}
`
	}
	cfg := mustParse(t, doc("secrets/pg.url"), dir, noEnv)
	if got := cfg.DatabaseURL.Reveal(); got != fileURL {
		t.Fatalf("the URL read from its file is %q", got)
	}
	if cfg.DatabaseURLFile != filepath.Join(dir, "secrets", "pg.url") {
		t.Errorf("database_url_file resolved to %q, want it beside the config", cfg.DatabaseURLFile)
	}
	cfg = mustParse(t, doc("secrets/pg.url"), dir, envOf(map[string]string{config.EnvDatabaseURL: envURL}))
	if got := cfg.DatabaseURL.Reveal(); got != envURL {
		t.Fatalf("with %s set the URL is %q, want the environment's", config.EnvDatabaseURL, got)
	}
	jsonOut, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{fmt.Sprintf("%v %+v %#v", cfg, cfg, *cfg), string(jsonOut)} {
		if strings.Contains(out, "never-printed") {
			t.Errorf("a printed config holds the database password: %s", out)
		}
	}
	if plain := mustParse(t, strings.Replace(doc(""), "database_url_file: \n", "", 1), dir, noEnv); plain.DatabaseURL.IsSet() {
		t.Error("without a database URL the journal must stay on SQLite")
	}
	for name, c := range map[string]struct {
		doc   string
		env   map[string]string
		field string
	}{
		"not postgres":  {doc("secrets/bad.url"), nil, "database_url_file"},
		"missing file":  {doc("secrets/none.url"), nil, "database_url_file"},
		"empty file":    {doc("secrets/empty"), nil, "database_url_file"},
		"env not a URL": {strings.Replace(doc(""), "database_url_file: \n", "", 1), map[string]string{config.EnvDatabaseURL: "host=db password=env-pw-never-printed"}, config.EnvDatabaseURL},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := config.Parse([]byte(c.doc), dir, envOf(c.env))
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("error %v, want one naming %s", err, c.field)
			}
			if strings.Contains(err.Error(), "pw-") {
				t.Fatalf("the error quotes the URL: %v", err)
			}
		})
	}
}
