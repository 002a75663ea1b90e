// Command mindroomd is the durable Matrix event journal and delivery daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(os.Stdout)
	if err := m.ParseFlags(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "mindroomd:", err)
		os.Exit(2)
	}
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mindroomd:", err)
		os.Exit(1)
	}
}

// usage lists the subcommands this build offers.
const usage = `usage: mindroomd <command> [flags]

commands:
  status    summarise the journal: principals, pending work, undelivered replies
  version   print the version
`

// Main is the program: parse the command line, run one subcommand, close.
type Main struct {
	out     io.Writer
	command string
	storage string
}

// NewMain returns a Main writing its output to out.
func NewMain(out io.Writer) *Main { return &Main{out: out} }

// ParseFlags reads the subcommand and its flags.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(m.out, usage)
		return flag.ErrHelp
	}
	m.command = args[0]
	fs := flag.NewFlagSet("mindroomd "+m.command, flag.ContinueOnError)
	fs.SetOutput(m.out)
	switch m.command {
	case "status":
		fs.StringVar(&m.storage, "storage", envOr("MINDROOMD_STORAGE", "mindroom_data"), "storage directory (env MINDROOMD_STORAGE)")
	case "version":
	default:
		fmt.Fprint(m.out, usage)
		return fmt.Errorf("unknown command %q", m.command)
	}
	return fs.Parse(args[1:])
}

// Run runs the parsed subcommand.
func (m *Main) Run(ctx context.Context) error {
	switch m.command {
	case "version":
		_, err := fmt.Fprintln(m.out, "mindroomd", Version)
		return err
	case "status":
		return runStatus(ctx, m.out, m.storage)
	}
	return nil
}

// Close releases what Run opened; subcommands close their own resources.
func (m *Main) Close() error { return nil }

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
