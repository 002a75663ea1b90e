package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/mcpserver"
)

// mcpShutdownGrace bounds how long mcp waits for its session to close after
// a signal: a blocked read of stdin may never return.
const mcpShutdownGrace = 2 * time.Second

// mcpCommand is the mcp subcommand: one agent's tools served over the Model
// Context Protocol on stdin and stdout, each a call of a running daemon's
// agent API.
type mcpCommand struct {
	in     io.ReadCloser
	out    io.Writer
	errOut io.Writer
	// journal holds -config; the journal itself is never opened.
	journal *journalFlags
	agent   string
	api     string
}

// newMCPCommand returns m's mcp subcommand, its flags registered on fs.
// It reads the protocol from stdin and writes it to m's output.
func newMCPCommand(m *Main, fs *flag.FlagSet) *mcpCommand {
	c := &mcpCommand{in: os.Stdin, out: m.out, errOut: m.errOut, journal: &m.journal}
	c.register(fs)
	return c
}

// register adds mcp's flags to fs.
func (c *mcpCommand) register(fs *flag.FlagSet) {
	fs.StringVar(&c.journal.config, "config", defaultConfig, "the daemon's configuration file: its listen address and the agent's api_token_file")
	fs.StringVar(&c.agent, "agent", "", "the agent the tools act for (default: the only configured agent)")
	fs.StringVar(&c.api, "api", "", "the agent API's base URL (default: http:// and the configured listen address)")
}

// mcpUsage is a command line mcp cannot run, with mcp's help named.
func mcpUsage(err error) error { return &usageError{command: "mcp", err: err} }

// Run serves MCP on stdin and stdout until stdin closes or ctx ends.
// Stdout is the protocol's: the log goes to stderr only.
func (c *mcpCommand) Run(ctx context.Context) error {
	cfg, err := c.journal.load()
	if err != nil {
		return err
	}
	a, err := mcpAgent(cfg, c.agent)
	if err != nil {
		return err
	}
	base := c.api
	if base == "" {
		if base, err = listenURL(cfg.Listen); err != nil {
			var ue *usageError
			if errors.As(err, &ue) {
				return mcpUsage(ue.err)
			}
			return err
		}
	}
	u, err := apiURL(base)
	if err != nil {
		return mcpUsage(err)
	}
	if !a.APIToken.IsSet() {
		return &config.Error{Field: "agents." + a.Name + ".api_token_file",
			Err: errors.New("mindroomd mcp calls the agent API with the agent's token; configure its api_token_file")}
	}
	log := zerolog.New(c.errOut).With().Timestamp().Str("agent", a.Name).Logger()
	srv := mcpserver.New(mcpserver.Options{Agent: a.Name, API: u.String(), Token: a.APIToken.Reveal(), Log: log, Version: version})
	ss, err := srv.Connect(ctx, &mcp.IOTransport{Reader: c.in, Writer: nopWriteCloser{c.out}}, nil)
	if err != nil {
		return fmt.Errorf("mcp: %w", err)
	}
	log.Info().Str("api", u.Redacted()).Msg("Serving MCP on stdio")
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case err := <-ended:
		// The client closed stdin: the normal end.
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, mcp.ErrConnectionClosed) {
			return fmt.Errorf("mcp: %w", err)
		}
	case <-ctx.Done():
		_ = ss.Close()
		select {
		case <-ended:
		case <-time.After(mcpShutdownGrace):
		}
	}
	log.Info().Msg("MCP session ended")
	return nil
}

// mcpAgent is the configured agent named name, or the only one when name
// is empty.
func mcpAgent(cfg *config.Config, name string) (config.Agent, error) {
	names := make([]string, 0, len(cfg.Agents))
	for _, a := range cfg.Agents {
		if a.Name == name || (name == "" && len(cfg.Agents) == 1) {
			return a, nil
		}
		names = append(names, a.Name)
	}
	if name == "" {
		return config.Agent{}, mcpUsage(fmt.Errorf("-agent is required: the configuration has %d agents (%s)", len(names), strings.Join(names, ", ")))
	}
	return config.Agent{}, mcpUsage(fmt.Errorf("no agent %q in the configuration (it has %s)", name, strings.Join(names, ", ")))
}

// nopWriteCloser is a writer the transport may close without closing it:
// stdout stays the process's.
type nopWriteCloser struct{ io.Writer }

// Close implements io.Closer.
func (nopWriteCloser) Close() error { return nil }
