// Command mindroomd is the durable Matrix event journal and delivery daemon.
//
// Its exit code tells a script or a service manager what went wrong:
//
//	0  success, or help was asked for (-h, -help, help)
//	1  any other failure
//	2  usage error: no command, or an unknown command, flag or argument
//	3  configuration error: the daemon's configuration file
//	4  the journal is refused or damaged, in SQLite or PostgreSQL alike:
//	   another application's file or schema, a schema newer or older than
//	   this binary's, or a journal its database finds corrupt
//
// Codes 2 to 4 are failures that running the same command again cannot
// mend, so a service manager can be told not to restart on them.
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
	"time"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
)

// version is set at build time with -ldflags "-X main.version=..."; make
// build stamps the commit.
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts an orderly shutdown; the handler then goes,
	// so a second signal ends the process at once.
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// The process's exit codes; exitCodes documents each in the usage text.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitConfig  = 3
	exitJournal = 4
)

// exitCodes is the table the usage text prints, in the package comment's
// words.
var exitCodes = []struct {
	code    int
	meaning string
}{
	{exitOK, "success, or help was asked for (-h, -help, help)"},
	{exitFailure, "any other failure"},
	{exitUsage, "usage error: no command, or an unknown command, flag or argument"},
	{exitConfig, "configuration error: the daemon's configuration file"},
	{exitJournal, "the journal or the crypto store is refused or damaged, in SQLite or\n" +
		"     PostgreSQL alike: another application's file or schema, a schema newer\n" +
		"     or older than this binary's, a journal its database finds corrupt, a\n" +
		"     pickle key or recovery key that does not open the agent's keys, or\n" +
		"     olm keys other than those the homeserver publishes for the device"},
}

// execute runs one command line and returns the process's exit code. Help
// and command output go to stdout; an error goes to stderr, once, here.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	m := NewMain(stdout, stderr)
	err := m.ParseFlags(ctx, args)
	if err == nil {
		err = m.Run(ctx)
		if cerr := m.Close(); err == nil {
			err = cerr
		}
	}
	code := exitCode(err)
	if code == exitOK {
		return code
	}
	fmt.Fprintln(stderr, "mindroomd:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "run 'mindroomd %s' for usage\n", ue.helpArgs())
	}
	return code
}

// exitCode maps the error a command line ended with to its exit code.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, config.ErrConfig):
		return exitConfig
	case refusedJournal(err):
		return exitJournal
	}
	return exitFailure
}

// refusedJournal reports a journal this binary will not use as it stands,
// on either backend: one migration refuses, or one its database finds
// damaged. Each waits for someone to act (another binary, a migration, a
// restore). A full disk, an I/O error or a lost connection can pass by
// itself, so it is not among them.
func refusedJournal(err error) bool {
	return migration.Refused(err) || errors.Is(err, journal.ErrCorrupt) || errors.Is(err, e2ee.ErrRefused)
}

// usageError is a command line mindroomd cannot run.
type usageError struct {
	// command is the subcommand whose help explains the mistake; empty for
	// the top level.
	command string
	err     error
}

// Error implements error.
func (e *usageError) Error() string { return e.err.Error() }

// Unwrap returns the underlying error, such as a flag parsing error.
func (e *usageError) Unwrap() error { return e.err }

// helpArgs is the command line that prints the help for the mistake.
func (e *usageError) helpArgs() string {
	if e.command == "" {
		return "-h"
	}
	return e.command + " -h"
}

// commands lists the subcommands for the top-level help and each one's own.
var commands = []struct{ name, summary string }{
	{"run", "run the daemon: sync, journal and answer for every configured agent"},
	{"status", "summarise the journal: pending work, replies by state, sync age, file sizes"},
	{"export", "write one conversation, oldest message first, as the agent API's export does"},
	{"backup", "write a consistent copy of the journal to a new file, beside a running daemon"},
	{"mcp", "serve one agent's tools over the Model Context Protocol on stdin and stdout, through the daemon's API"},
	{"version", "print the version"},
	{"help", "print this help, or a command's: help <command>"},
}

// writeUsage prints the top-level help.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, "usage: mindroomd <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'mindroomd <command> -h' for a command's flags.\n\nexit codes:\n")
	for _, c := range exitCodes {
		fmt.Fprintf(w, "  %d  %s\n", c.code, c.meaning)
	}
}

// summary is a subcommand's line in the help.
func summary(command string) string {
	for _, c := range commands {
		if c.name == command {
			return c.summary
		}
	}
	return ""
}

// Main is the program: parse the command line, run one subcommand, close.
type Main struct {
	out     io.Writer
	errOut  io.Writer
	now     func() time.Time
	command string
	journal journalFlags
	to      string
	export  exportOptions
	mcp     *mcpCommand
}

// NewMain returns a Main writing its output to out, and the daemon's log
// and an export's progress to errOut.
func NewMain(out, errOut io.Writer) *Main { return &Main{out: out, errOut: errOut, now: time.Now} }

// ParseFlags reads the subcommand and its flags. When help is asked for it
// prints it to the output and returns flag.ErrHelp; a command line it
// cannot run is a *usageError.
func (m *Main) ParseFlags(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return &usageError{err: errors.New("no command")}
	}
	m.command = args[0]
	fs := flag.NewFlagSet("mindroomd "+m.command, flag.ContinueOnError)
	// The flag package would print its error and the defaults on every
	// failure; execute prints the error once, and help goes to the output.
	fs.SetOutput(io.Discard)
	switch m.command {
	case "help":
		if len(args) > 1 {
			return m.ParseFlags(ctx, []string{args[1], "-h"})
		}
		writeUsage(m.out)
		return flag.ErrHelp
	case "-h", "-help", "--help":
		writeUsage(m.out)
		return flag.ErrHelp
	case "run":
		m.journal.register(fs, false)
	case "status":
		m.journal.register(fs, true)
	case "backup":
		m.journal.register(fs, true)
		fs.StringVar(&m.to, "to", "", "the backup file to create (required; never overwritten)")
	case "export":
		m.journal.register(fs, false)
		fs.StringVar(&m.export.agent, "agent", "", "the agent whose conversation it is (default: the only configured agent)")
		fs.StringVar(&m.export.room, "room", "", "the room ID (required)")
		fs.StringVar(&m.export.thread, "thread", "", "the event ID of a thread root: export the thread instead of the room")
		fs.StringVar(&m.export.format, "format", formatJSONLines, "jsonl (one message object a line) or markdown")
		fs.StringVar(&m.export.api, "api", "", "the agent API's base URL (default: http:// and the configured listen address)")
		fs.StringVar(&m.export.tokenFile, "token-file", "",
			"a file holding the agent's API token (default: $"+envAPIToken+", else the agent's api_token_file)")
		fs.BoolVar(&m.export.offline, "offline", false, "read the journal itself, read-only, instead of asking the daemon")
	case "mcp":
		m.mcp = newMCPCommand(m, fs)
	case "version":
	default:
		return &usageError{err: fmt.Errorf("unknown command %q", m.command)}
	}
	err := fs.Parse(args[1:])
	m.journal.parsed(fs)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(m.out, "usage: mindroomd %s [flags]\n\n%s\n", m.command, summary(m.command))
		fs.SetOutput(m.out)
		fs.PrintDefaults()
		return err
	case err != nil:
		return &usageError{command: m.command, err: err}
	case fs.NArg() > 0:
		return &usageError{command: m.command, err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	case m.command == "backup" && m.to == "":
		return &usageError{command: m.command, err: errors.New("-to is required")}
	case m.command == "export":
		if err := m.export.check(); err != nil {
			return &usageError{command: m.command, err: err}
		}
	}
	return nil
}

// Run runs the parsed subcommand.
func (m *Main) Run(ctx context.Context) error {
	switch m.command {
	case "version":
		_, err := fmt.Fprintln(m.out, "mindroomd", version)
		return err
	case "status":
		cfg, err := m.journal.load()
		if err != nil {
			return err
		}
		return runStatus(ctx, m.out, journalOptions(cfg), m.now)
	case "export":
		cfg, err := m.journal.load()
		if err != nil {
			return err
		}
		return runExport(ctx, m.out, m.errOut, cfg, m.export)
	case "run":
		cfg, err := m.journal.load()
		if err != nil {
			return err
		}
		return runDaemon(ctx, m.errOut, cfg)
	case "backup":
		cfg, err := m.journal.load()
		if err != nil {
			return err
		}
		return runBackup(ctx, m.out, cfg, m.to)
	case "mcp":
		return m.mcp.Run(ctx)
	}
	return nil
}

// Close releases what Run opened; subcommands close their own resources.
func (m *Main) Close() error { return nil }
