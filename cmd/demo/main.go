// Command demo shows mindroomd answering a conversation end to end: it
// starts a local Dendrite in ./.demo, registers an agent and a person, runs
// bin/mindroomd with the agent's back-end, has the person write three
// messages (one edited afterwards, one in a thread), waits for the answers,
// and prints the conversation as the agent API serves it, then the
// journal's status. DEMO_KEEP=1 leaves both servers running.
//
// The room is end-to-end encrypted as Element creates one (m.room.encryption
// in its initial state): the person writes from a device of her own with
// its own keys (testsupport/e2eeperson) and decrypts the agent's answers,
// which the daemon seals. -encrypted=false (ENCRYPTED=0 make demo) plays
// the same conversation in a room in the clear.
//
// -agent picks the back-end: echo (built in), exec (examples/echo-agent.py,
// run by python3 once per turn) or openai, streamed, against a stand-in
// OpenAI-compatible model server the demo runs on loopback, which answers
// each question with a canned sentence a word at a time.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
)

const (
	demoDir = ".demo"
	binary  = "bin/mindroomd"
	// deadline bounds the whole demo once the servers run.
	deadline = 2 * time.Minute
	// pollEvery is how often a wait without a sync loop looks again.
	pollEvery = 200 * time.Millisecond
)

func main() {
	agentType := flag.String("agent", "echo", "the back-end that answers: echo, exec or openai")
	encrypted := flag.Bool("encrypted", true, "play the conversation in an end-to-end encrypted room (false: in the clear)")
	flag.Parse()
	if err := run(*agentType, *encrypted); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(agentType string, encrypted bool) error {
	switch agentType {
	case "echo", "exec", "openai":
	default:
		return fmt.Errorf("-agent %q is not one of echo, exec, openai", agentType)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	keep := os.Getenv("DEMO_KEEP") == "1"

	if err := os.RemoveAll(demoDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(demoDir, "dendrite"), 0o700); err != nil {
		return err
	}
	step("Starting Dendrite in %s", demoDir)
	hsDir, err := filepath.Abs(filepath.Join(demoDir, "dendrite"))
	if err != nil {
		return err
	}
	hs, err := dendrite.Launch(hsDir)
	if err != nil {
		return err
	}
	if !keep {
		defer hs.Stop()
	}
	// The agent is named after its back-end: the account, and the agent
	// API's paths, say which one answered.
	name := agentType
	bot, err := hs.RegisterAccount(ctx, name, secret())
	if err != nil {
		return err
	}
	alice, err := hs.RegisterAccount(ctx, "alice", secret())
	if err != nil {
		return err
	}
	step("Registered %s and %s on %s", bot.UserID, alice.UserID, hs.URL)

	backend, model, err := backendConfig(agentType)
	if err != nil {
		return err
	}
	if model != nil {
		defer model.Close()
		step("Started a stand-in OpenAI-compatible model server at %s", model.URL)
	}
	listen, err := freeAddress()
	if err != nil {
		return err
	}
	apiToken := secret()
	cfg, err := writeConfig(hs.URL, listen, name, bot, apiToken, backend)
	if err != nil {
		return err
	}
	daemon, err := startDaemon(cfg)
	if err != nil {
		return err
	}
	if !keep {
		defer stopDaemon(daemon)
	}
	step("Started %s run -config %s (log in %s)", binary, cfg, filepath.Join(demoDir, "mindroomd.log"))

	person, err := openPerson(ctx, hs.URL, alice, encrypted)
	if err != nil {
		return err
	}
	defer person.close()
	room, err := person.createRoom(ctx, bot.UserID)
	if err != nil {
		return err
	}
	step("Alice created %s and the agent joined it", room)
	step("%s", person.kind())

	hello, err := person.sendText(ctx, room, "Hello, "+name+"!")
	if err != nil {
		return err
	}
	question, err := person.sendText(ctx, room, "What is 2 + 2?")
	if err != nil {
		return err
	}
	if err := person.edit(ctx, room, question, "What is 2 + 3?"); err != nil {
		return err
	}
	if err := person.threadReply(ctx, room, hello, "And in a thread?"); err != nil {
		return err
	}
	step("Alice wrote three messages, edited the second, and replied in a thread to the first")

	progress, answers, err := awaitAnswers(ctx, person, room, bot.UserID, 3)
	if err != nil {
		return err
	}
	step("The agent answered each message once")
	if encrypted {
		step("Each answer came sealed (m.room.encrypted) and Alice's device decrypted it")
	}
	if model != nil {
		step("The model was asked %d times; the answers were shown in %d progress edits on their way", len(model.Requests()), progress)
	}

	api := agentAPI{listen: listen, agent: name, token: apiToken}
	roomLines, threadLines, err := api.awaitAnswers(ctx, room, hello, answers)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Printf("The room, as GET /v1/agents/%s/rooms/{room}/messages serves it:\n", name)
	printConversation(roomLines)
	fmt.Println()
	fmt.Println("The thread of the first message (the same route, ?thread=):")
	printConversation(threadLines)
	fmt.Println()
	fmt.Println("The journal, as mindroomd status reports it:")
	status := exec.CommandContext(ctx, binary, "status", "-storage", filepath.Join(demoDir, "storage"))
	status.Stdout, status.Stderr = os.Stdout, os.Stderr
	if err := status.Run(); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if keep {
		fmt.Printf("\nDEMO_KEEP=1: Dendrite stays at %s and mindroomd at http://%s (pid %d).\n", hs.URL, listen, daemon.Process.Pid)
		if model != nil {
			fmt.Println("The stand-in model server ends with the demo: the agent's next turns fail until a real one listens there.")
		}
	}
	return nil
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// secret is a random password or token.
func secret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freeAddress is a loopback address nothing listens on now.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// backendConfig is the agent's backend section, its keys indented under
// backend:, and the model server the openai back-end talks to.
func backendConfig(agentType string) (string, *modelstub.Server, error) {
	switch agentType {
	case "exec":
		script, err := filepath.Abs("examples/echo-agent.py")
		if err != nil {
			return "", nil, err
		}
		command, err := json.Marshal([]string{"python3", script})
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("      type: exec\n      command: %s\n      timeout: 30s\n", command), nil, nil
	case "openai":
		model, err := modelstub.Start(func(r modelstub.Request) modelstub.Reply {
			return modelstub.Reply{Delay: 120 * time.Millisecond, Text: fmt.Sprintf(
				"You asked %q. I am the demo's stand-in for a model, so all I can do is stream this sentence back to you, a word at a time.",
				r.Question())}
		})
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("      type: openai\n      base_url: %s\n      model: demo-stub\n"+
			"      system_prompt: You are the mindroomd demo agent.\n      stream: true\n", model.URL), model, nil
	}
	return "      type: echo\n", nil, nil
}

// writeConfig writes the daemon's configuration and its secret files.
func writeConfig(homeserver, listen, name string, account dendrite.Account, apiToken, backend string) (string, error) {
	for file, value := range map[string]string{name + ".password": account.Password, name + ".api-token": apiToken} {
		if err := os.WriteFile(filepath.Join(demoDir, file), []byte(value+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	cfg := fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: %s
agents:
  - name: %s
    user_id: "%s"
    password_file: ./%s.password
    api_token_file: ./%s.api-token
    auto_join: true
    backend:
%s`, homeserver, listen, name, account.UserID, name, name, backend)
	path := filepath.Join(demoDir, "mindroom.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

func startDaemon(cfg string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(demoDir, "mindroomd.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "run", "-config", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd, cmd.Start()
}

// stopDaemon asks the daemon to shut down and waits for it.
func stopDaemon(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: mindroomd exited:", err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		fmt.Fprintln(os.Stderr, "demo: mindroomd did not stop in 30 s; killed")
	}
}

// awaitAnswers waits until the agent has sent n final answers in room, a
// placeholder and its progress edits being no answer, and fails if it sent
// more. It returns how many progress edits (edits marked still streaming)
// the agent sent on the way, and the text of each answer: an edit's new
// text, when the answer is the last edit of a streamed placeholder.
func awaitAnswers(ctx context.Context, p person, room, agent string, n int) (progress int, answers []string, err error) {
	for {
		contents, err := p.agentMessages(ctx, room, agent)
		if err != nil {
			return 0, nil, err
		}
		progress, answers = 0, nil
		for _, content := range contents {
			nc, _ := content["m.new_content"].(map[string]any)
			if marker, _ := content["io.mindroomd.delivery"].(map[string]any); marker["stage"] == "final" {
				text, _ := content["body"].(string)
				if nc != nil {
					text, _ = nc["body"].(string)
				}
				answers = append(answers, text)
			}
			if nc["io.mindroom.stream_status"] == "streaming" {
				progress++
			}
		}
		switch {
		case len(answers) > n:
			return progress, answers, fmt.Errorf("the agent sent %d answers to %d messages", len(answers), n)
		case len(answers) == n:
			return progress, answers, nil
		}
		if err := p.more(ctx); err != nil {
			return progress, answers, fmt.Errorf("waiting for %d answers: %w", n, err)
		}
	}
}

// pause waits pollEvery: the person in a clear room has no sync loop to
// wake it when what it waits on comes, so it looks again.
func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pollEvery):
		return nil
	}
}

// agentAPI is the daemon's agent API for one agent.
type agentAPI struct {
	listen, agent, token string
}

// line is one message of a conversation as the agent API serves it.
type line struct {
	who, body string
}

// awaitAnswers reads the room and the thread of root through the agent
// API until, between them, they show each of answers. The agent's journal
// takes in its own answers from the homeserver (in an encrypted room,
// decrypting them), a moment after the person may have read them, so the
// API is read again until it has.
func (a agentAPI) awaitAnswers(ctx context.Context, room, root string, answers []string) (roomLines, threadLines []line, err error) {
	for {
		if roomLines, err = a.conversation(ctx, room, ""); err != nil {
			return nil, nil, err
		}
		if threadLines, err = a.conversation(ctx, room, root); err != nil {
			return nil, nil, err
		}
		shown := map[string]bool{}
		for _, l := range append(slices.Clone(roomLines), threadLines...) {
			shown[l.body] = true
		}
		missing := slices.DeleteFunc(slices.Clone(answers), func(answer string) bool { return shown[answer] })
		if len(missing) == 0 {
			return roomLines, threadLines, nil
		}
		if err := pause(ctx); err != nil {
			return nil, nil, fmt.Errorf("the agent API never showed the answers %q: %w", missing, err)
		}
	}
}

// conversation reads a conversation (the room, or the thread of root)
// through the agent API, oldest first.
func (a agentAPI) conversation(ctx context.Context, room, root string) ([]line, error) {
	q := url.Values{"limit": {"50"}}
	if root != "" {
		q.Set("thread", root)
	}
	u := "http://" + a.listen + "/v1/agents/" + a.agent + "/rooms/" + url.PathEscape(room) + "/messages?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent API: %s: %s", resp.Status, body)
	}
	var page struct {
		Messages []struct {
			Sender  string          `json:"sender"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, err
	}
	if len(page.Messages) == 0 {
		return nil, errors.New("agent API: the conversation is empty")
	}
	var lines []line
	for _, m := range page.Messages {
		var c struct {
			Body string `json:"body"`
		}
		_ = json.Unmarshal(m.Content, &c)
		lines = append(lines, line{who: strings.TrimPrefix(strings.SplitN(m.Sender, ":", 2)[0], "@"), body: c.Body})
	}
	return lines, nil
}

// printConversation prints a conversation one line a message.
func printConversation(lines []line) {
	for _, l := range lines {
		fmt.Printf("  %-8s %s\n", l.who+":", l.body)
	}
}
