// Command demo shows mindroomd answering a conversation end to end: it
// starts a local Dendrite in ./.demo, registers an echo agent and a person,
// runs bin/mindroomd with the echo back-end, has the person write three
// messages (one edited afterwards, one in a thread), waits for the answers,
// and prints the conversation as the agent API serves it, then the
// journal's status. DEMO_KEEP=1 leaves both servers running.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

const (
	demoDir = ".demo"
	binary  = "bin/mindroomd"
	// deadline bounds the whole demo once the servers run.
	deadline = 2 * time.Minute
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
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
	echo, err := hs.RegisterAccount(ctx, "echo", secret())
	if err != nil {
		return err
	}
	alice, err := hs.RegisterAccount(ctx, "alice", secret())
	if err != nil {
		return err
	}
	step("Registered %s and %s on %s", echo.UserID, alice.UserID, hs.URL)

	listen, err := freeAddress()
	if err != nil {
		return err
	}
	apiToken := secret()
	cfg, err := writeConfig(hs.URL, listen, echo, apiToken)
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

	person, err := mautrix.NewClient(hs.URL, id.UserID(alice.UserID), alice.AccessToken)
	if err != nil {
		return err
	}
	created, err := person.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Invite: []id.UserID{id.UserID(echo.UserID)}})
	if err != nil {
		return err
	}
	room := created.RoomID
	if err := awaitJoin(ctx, person, room, id.UserID(echo.UserID)); err != nil {
		return err
	}
	step("Alice created %s and the agent joined it", room)

	hello, err := person.SendText(ctx, room, "Hello, echo!")
	if err != nil {
		return err
	}
	question, err := person.SendText(ctx, room, "What is 2 + 2?")
	if err != nil {
		return err
	}
	edit := event.MessageEventContent{MsgType: event.MsgText, Body: "* What is 2 + 3?",
		NewContent: &event.MessageEventContent{MsgType: event.MsgText, Body: "What is 2 + 3?"},
		RelatesTo:  &event.RelatesTo{Type: event.RelReplace, EventID: question.EventID}}
	if _, err := person.SendMessageEvent(ctx, room, event.EventMessage, &edit); err != nil {
		return err
	}
	thread := event.MessageEventContent{MsgType: event.MsgText, Body: "And in a thread?",
		RelatesTo: &event.RelatesTo{Type: event.RelThread, EventID: hello.EventID}}
	if _, err := person.SendMessageEvent(ctx, room, event.EventMessage, &thread); err != nil {
		return err
	}
	step("Alice wrote three messages, edited the second, and replied in a thread to the first")

	if err := awaitAnswers(ctx, person, room, echo.UserID, 3); err != nil {
		return err
	}
	step("The agent answered each message once")

	fmt.Println()
	fmt.Println("The room, as GET /v1/agents/echo/rooms/{room}/messages serves it:")
	if err := printConversation(ctx, listen, apiToken, room.String(), ""); err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("The thread of the first message (the same route, ?thread=):")
	if err := printConversation(ctx, listen, apiToken, room.String(), hello.EventID.String()); err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("The journal, as mindroomd status reports it:")
	status := exec.CommandContext(ctx, binary, "status", "-storage", filepath.Join(demoDir, "storage"))
	status.Stdout, status.Stderr = os.Stdout, os.Stderr
	if err := status.Run(); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if keep {
		fmt.Printf("\nDEMO_KEEP=1: Dendrite stays at %s and mindroomd at http://%s (pid %d).\n", hs.URL, listen, daemon.Process.Pid)
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

// writeConfig writes the daemon's configuration and its secret files.
func writeConfig(homeserver, listen string, echo dendrite.Account, apiToken string) (string, error) {
	for name, value := range map[string]string{"echo.password": echo.Password, "echo.api-token": apiToken} {
		if err := os.WriteFile(filepath.Join(demoDir, name), []byte(value+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	cfg := fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: %s
agents:
  - name: echo
    user_id: "%s"
    password_file: ./echo.password
    api_token_file: ./echo.api-token
    auto_join: true
    backend:
      type: echo
`, homeserver, listen, echo.UserID)
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

// awaitJoin waits until user is a member of room.
func awaitJoin(ctx context.Context, c *mautrix.Client, room id.RoomID, user id.UserID) error {
	for {
		members, err := c.JoinedMembers(ctx, room)
		if err == nil {
			if _, ok := members.Joined[user]; ok {
				return nil
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("the agent never joined %s: %w", room, err)
		}
	}
}

// awaitAnswers waits until the agent has sent n messages in room.
func awaitAnswers(ctx context.Context, c *mautrix.Client, room id.RoomID, agent string, n int) error {
	for {
		msgs, err := c.Messages(ctx, room, "", "", mautrix.DirectionBackward, nil, 100)
		if err == nil {
			count := 0
			for _, ev := range msgs.Chunk {
				if ev.Sender.String() == agent && ev.Type == event.EventMessage {
					count++
				}
			}
			if count >= n {
				return nil
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("waiting for %d answers: %w", n, err)
		}
	}
}

func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(200 * time.Millisecond):
		return nil
	}
}

// printConversation reads a conversation (the room, or the thread of root)
// through the agent API and prints it oldest first, one line a message.
func printConversation(ctx context.Context, listen, token, room, root string) error {
	q := url.Values{"limit": {"50"}}
	if root != "" {
		q.Set("thread", root)
	}
	u := "http://" + listen + "/v1/agents/echo/rooms/" + url.PathEscape(room) + "/messages?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent API: %s: %s", resp.Status, body)
	}
	var page struct {
		Messages []struct {
			Sender  string          `json:"sender"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return err
	}
	if len(page.Messages) == 0 {
		return errors.New("agent API: the conversation is empty")
	}
	for _, m := range page.Messages {
		var c struct {
			Body string `json:"body"`
		}
		_ = json.Unmarshal(m.Content, &c)
		who := strings.TrimPrefix(strings.SplitN(m.Sender, ":", 2)[0], "@")
		fmt.Printf("  %-6s %s\n", who+":", c.Body)
	}
	return nil
}
