package config_test

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
)

// fuzzAPIToken is a second agent's API token, so two agents can be valid
// together; the fuzz directory's secrets/same-token repeats apiToken.
const fuzzAPIToken = "api2-71b0c2-never-printed"

// fuzzSecrets are every secret of the fuzz directory; no refusal or
// printout may show one.
var fuzzSecrets = append(allSecrets[:len(allSecrets):len(allSecrets)], fuzzAPIToken)

// configFieldName is every field name an *Error may carry: as written in the
// file, agents indexed.
var configFieldName = regexp.MustCompile(`^(homeserver|listen|agents|agents\[\d+\]\.(name|user_id|password_file|access_token_file|api_token_file|` +
	`backend\.(type|command|timeout|env(\[\d+\])?|base_url|model|api_key_file|system_prompt|context_messages|stream)))$`)

// fuzzSecretsDir fills a fresh directory with small secret files: one per
// secret, a second API token, a copy of the first one and an empty file.
func fuzzSecretsDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "secrets"), 0o700); err != nil {
		tb.Fatal(err)
	}
	for name, content := range map[string]string{
		"password":     password + "\n",
		"access-token": accessToken + "\r\n",
		"api-token":    apiToken + "\n",
		"api-token-2":  fuzzAPIToken,
		"same-token":   apiToken,
		"api-key":      apiKey + "\n",
		"empty":        "\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, "secrets", name), []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// secretPathsStayInside reports whether every secret file doc names lies
// inside the directory the paths resolve against, so a fuzzed path cannot
// read a file of the machine (or block on a device). It reads doc as Parse
// will: a path Parse would read is one this decode finds.
func secretPathsStayInside(doc []byte) bool {
	var cfg config.Config
	_ = yaml.Unmarshal(doc, &cfg) // a partial decode still shows its paths
	for _, a := range cfg.Agents {
		for _, p := range []string{a.PasswordFile, a.AccessTokenFile, a.APITokenFile, a.Backend.OpenAI.APIKeyFile} {
			if p != "" && !filepath.IsLocal(p) {
				return false
			}
		}
	}
	return true
}

// FuzzConfig parses arbitrary YAML under arbitrary environment overrides.
// Parse never panics; a refusal is an *Error matching ErrConfig that names
// a field of the file (or, for the file as a whole, says what is wrong with
// the document) and shows no secret; an accepted config holds everything
// validation promises.
func FuzzConfig(f *testing.F) {
	const (
		hs    = "homeserver: http://127.0.0.1:8008\n"
		agent = "agents:\n  - name: echo\n    user_id: \"@echo:localhost\"\n    password_file: secrets/password\n"
		echo  = "    backend: {type: echo}\n"
		valid = hs + agent + echo
	)
	docs := []string{
		valid,
		hs + "storage: ./mindroom_data\nlisten: 127.0.0.1:8787\n" + agent +
			"    api_token_file: ./secrets/api-token\n    auto_join: true\n    backend:\n      type: echo\n",
		"listen: \"[::]:8787\"\n" + hs + `agents:
  - name: one
    user_id: "@one:localhost"
    password_file: secrets/password
    api_token_file: secrets/api-token
    backend: {type: openai, base_url: "https://api.example.org/v1", model: m, api_key_file: secrets/api-key,
              system_prompt: "be brief", context_messages: 1000, stream: true}
  - name: two
    user_id: "@two:localhost"
    access_token_file: secrets/access-token
    api_token_file: secrets/api-token-2
    backend: {type: exec, command: [python3, agent.py], timeout: 1m30s, env: [OPENAI_API_KEY, LC_ALL]}
  - {name: three, user_id: "@three:localhost", password_file: secrets/password, api_token_file: secrets/same-token, backend: {type: http}}
`,
		// Anchors, aliases and a merge key spell the same agent twice.
		hs + "x: &a {name: a, user_id: \"@a:l\", password_file: secrets/password, backend: {type: echo}}\nagents: [*a, {<<: *a, name: b}]\n",
		"",
		"# only a comment\n",
		"- a\n- b\n",
		"homeserver: [http://h]\n",
		valid + "---\nhomeserver: http://other\n",
		valid + "---\n[\n",
		valid + "homeserver: http://again\n",
		valid + "homeservr: http://typo\n",
		hs + agent + "    backend: {type: exec, command: [x], timeout: 30}\n",
		hs + agent + "    backend: {type: exec, command: [x], timeout: -1s}\n",
		hs + agent + "    backend: {type: exec, command: [\"\"]}\n",
		hs + agent + "    backend: {type: echo, command: [x]}\n",
		hs + agent + "    backend: {type: exec, command: [x], env: [MINDROOM_DATABASE_URL]}\n",
		hs + agent + "    backend: {type: exec, command: [x], env: [\"A=B\", \"\"]}\n",
		hs + agent + "    backend: {type: http}\n",
		hs + agent + "    backend: {type: http, stream: true}\n",
		hs + agent + "    backend: {type: openai, base_url: api.example.org, model: m}\n",
		hs + agent + "    backend: {type: openai, base_url: \"http://h/v1\", model: m, context_messages: 5000}\n",
		hs + agent + "    backend: {type: gpt}\n",
		hs + agent + "    access_token_file: secrets/access-token\n" + echo,
		hs + "agents:\n  - {name: echo bot, user_id: \"@echo:localhost\", password_file: secrets/password, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: echo, user_id: \"@echo\", password_file: secrets/password, backend: {type: echo}}\n",
		hs + agent + echo + "  - {name: echo, user_id: \"@other:localhost\", password_file: secrets/password, backend: {type: echo}}\n",
		"listen: 0.0.0.0:8787\n" + valid,
		"listen: 127.0.0.1:99999\n" + valid,
		"homeserver: ftp://127.0.0.1\n" + agent + echo,
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/nope, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", password_file: secrets/empty, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", access_token_file: secrets, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", password_file: /etc/hostname, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", password_file: ../outside, backend: {type: echo}}\n",
		hs + "agents:\n  - {name: e, user_id: \"@e:l\", password_file: !!binary c2VjcmV0cy9wYXNzd29yZA==, backend: {type: echo}}\n",
		hs + "agents: &x [*x]\n",
		"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
		strings.Repeat("[", 5000) + strings.Repeat("]", 5000),
		"\xff\xfe" + valid,
		"\t" + valid,
	}
	for _, doc := range docs {
		f.Add([]byte(doc), "", "", "")
	}
	f.Add([]byte(valid), "https://matrix.example.org", "/var/lib/mindroomd", "127.0.0.1:0")
	f.Add([]byte(valid), "http://env", "relative/store", "[::1]:8787")
	f.Add([]byte("agents: []\n"), "http://env", "", "")
	f.Add([]byte(valid), "matrix.example.org", "", "")
	f.Add([]byte(valid), "", "", "0.0.0.0:8787")
	f.Add([]byte(valid), "", "", "localhost")
	f.Add([]byte(agent+echo), "http://h", "", "bot.example.org:8787")

	dir := fuzzSecretsDir(f)
	f.Fuzz(func(t *testing.T, doc []byte, envHomeserver, envStorage, envListen string) {
		if !secretPathsStayInside(doc) {
			return
		}
		env := map[string]string{
			config.EnvHomeserver:  envHomeserver,
			config.EnvStorage:     envStorage,
			config.EnvListen:      envListen,
			config.EnvDatabaseURL: "",
			config.EnvReplicaID:   "",
		}
		lookupEnv := func(name string) (string, bool) {
			v, ok := env[name]
			if !ok {
				t.Errorf("Parse read the environment variable %s", name)
			}
			return v, ok
		}
		cfg, err := config.Parse(doc, dir, lookupEnv)
		if err != nil {
			if cfg != nil {
				t.Fatalf("a refusal came with a config: %v", err)
			}
			checkConfigError(t, err)
			return
		}
		checkValidConfig(t, cfg, envStorage)
	})
}

// checkConfigError asserts that err is a configuration error that names its
// field or, for the file as a whole, is a decode error, and that it shows
// no secret.
func checkConfigError(t *testing.T, err error) {
	t.Helper()
	var ce *config.Error
	if !errors.As(err, &ce) || !errors.Is(err, config.ErrConfig) {
		t.Fatalf("refusal %v (%T) is not an *Error matching ErrConfig", err, err)
	}
	msg := err.Error()
	for _, s := range fuzzSecrets {
		if strings.Contains(msg, s) {
			t.Fatalf("refusal %q shows a secret", msg)
		}
	}
	switch {
	case ce.Field != "":
		if !configFieldName.MatchString(ce.Field) {
			t.Fatalf("refusal %q names %q, which is no field of the file", msg, ce.Field)
		}
		if !strings.HasPrefix(msg, ce.Field+": ") || len(msg) == len(ce.Field)+2 {
			t.Fatalf("refusal %q does not read field: reason", msg)
		}
		// The two halves of a principal are judged together; the reason
		// must be about the half the refusal names.
		if (strings.HasSuffix(ce.Field, ".user_id") && !strings.Contains(msg, "user ID")) ||
			(strings.HasSuffix(ce.Field, ".name") && strings.Contains(msg, "user ID")) {
			t.Fatalf("refusal %q names %s for another field's reason", msg, ce.Field)
		}
	case msg == "config is empty", strings.HasPrefix(msg, "yaml: "):
	case strings.HasPrefix(msg, "line ") && strings.Contains(msg, "a second YAML document"):
	default:
		t.Fatalf("whole-file refusal %q is not a decode error", msg)
	}
}

// checkValidConfig asserts what validation promises of an accepted config.
func checkValidConfig(t *testing.T, cfg *config.Config, envStorage string) {
	t.Helper()
	if u, err := url.Parse(cfg.Homeserver); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		t.Fatalf("homeserver %q accepted", cfg.Homeserver)
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		t.Fatalf("listen %q accepted", cfg.Listen)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if envStorage != "" {
		if cfg.Storage != envStorage {
			t.Fatalf("storage %q, want the environment's %q", cfg.Storage, envStorage)
		}
	} else if !filepath.IsAbs(cfg.Storage) {
		t.Fatalf("storage %q is not absolute", cfg.Storage)
	}
	if len(cfg.Agents) == 0 {
		t.Fatalf("a config without agents accepted")
	}
	names := make(map[string]bool, len(cfg.Agents))
	tokens := make(map[string]bool, len(cfg.Agents))
	for i, a := range cfg.Agents {
		where := fmt.Sprintf("agents[%d]", i)
		if _, err := journal.NewPrincipal(a.Name, a.UserID); err != nil {
			t.Fatalf("%s accepted: %v", where, err)
		}
		if names[a.Name] {
			t.Fatalf("%s repeats the name %q", where, a.Name)
		}
		names[a.Name] = true
		if a.Password.IsSet() == a.AccessToken.IsSet() {
			t.Fatalf("%s has both or neither of a password and an access token", where)
		}
		for _, s := range []struct {
			path string
			set  bool
		}{
			{a.PasswordFile, a.Password.IsSet()},
			{a.AccessTokenFile, a.AccessToken.IsSet()},
			{a.APITokenFile, a.APIToken.IsSet()},
			{a.Backend.OpenAI.APIKeyFile, a.Backend.OpenAI.APIKey.IsSet()},
		} {
			if (s.path != "") != s.set || (s.path != "" && !filepath.IsAbs(s.path)) {
				t.Fatalf("%s: secret file %q read: %v", where, s.path, s.set)
			}
		}
		if !loopback && !a.APIToken.IsSet() {
			t.Fatalf("%s has no API token behind listen %q", where, cfg.Listen)
		}
		if a.APIToken.IsSet() {
			if tokens[a.APIToken.Reveal()] {
				t.Fatalf("%s shares an API token", where)
			}
			tokens[a.APIToken.Reveal()] = true
		}
		b := a.Backend
		switch b.Type {
		case config.BackendEcho:
		case config.BackendHTTP:
			if !a.APIToken.IsSet() {
				t.Fatalf("%s: an http backend without an API token accepted", where)
			}
		case config.BackendExec:
			if len(b.Exec.Command) == 0 || b.Exec.Command[0] == "" || b.Exec.Timeout < 0 {
				t.Fatalf("%s: exec backend %+v accepted", where, b.Exec)
			}
			for _, name := range b.Exec.Env {
				if name == "" || strings.ContainsAny(name, "= ") || strings.HasPrefix(name, "MINDROOM_") {
					t.Fatalf("%s: exec env %q accepted", where, b.Exec.Env)
				}
			}
		case config.BackendOpenAI:
			if b.OpenAI.Model == "" || b.OpenAI.ContextMessages < 0 || b.OpenAI.ContextMessages > config.MaxContextMessages {
				t.Fatalf("%s: openai backend %+v accepted", where, b.OpenAI)
			}
		default:
			t.Fatalf("%s: backend type %q accepted", where, b.Type)
		}
		if b.Type != config.BackendExec && (b.Exec.Command != nil || b.Exec.Timeout != 0 || b.Exec.Env != nil) {
			t.Fatalf("%s: exec keys on a %s backend", where, b.Type)
		}
		if b.Type != config.BackendOpenAI && b.OpenAI != (config.OpenAI{}) {
			t.Fatalf("%s: openai keys on a %s backend", where, b.Type)
		}
	}
	printed := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg.Agents)
	for _, s := range fuzzSecrets {
		if strings.Contains(printed, s) {
			t.Fatalf("a printed config shows a secret: %s", printed)
		}
	}
}
