package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// listed is how many IDs a failed check prints; the rest are counted.
const listed = 10

// printResult prints the soak's table, the checks behind it and what the
// journal's status says.
func printResult(out io.Writer, o options, r result) {
	fmt.Fprintln(out)
	agent := "echo (built in)"
	if o.agent == "exec" {
		agent = fmt.Sprintf("exec, examples/echo-agent.py after 0-%s", o.agentDelay)
	}
	room := "not encrypted"
	if o.encrypted {
		room = "end-to-end encrypted (m.megolm.v1.aes-sha2), the person on a device of her own"
	}
	fmt.Fprintf(out, "kill-9 soak: %g messages/s, agent %s, seed %d\njournal: %s\nroom: %s\n", o.rate, agent, r.Seed, r.JournalOn, room)
	if r.Replicas > 1 {
		fmt.Fprintf(out, "replicas: %d daemons on the one journal (replicas: auto, replica_takeover %s), "+
			"%d agents, each in a room of its own with the person; each kill takes one replica\n", r.Replicas, replicaTakeover, r.Agents)
	}
	fmt.Fprintln(out)
	drain := "not drained"
	if r.Drained {
		drain = r.Drain.Round(10 * time.Millisecond).String()
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "K\tM\tTHREADED\tEDITS\tLOST\tDUPLICATED\tPENDING\tDRAIN AFTER LAST KILL\tWALL TIME")
	fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", o.k, r.Kills, r.Posted.Threaded, r.Posted.Edits,
		len(r.Server.Lost), r.Server.Duplicated, r.Journal.Pending, drain, r.Wall.Round(100*time.Millisecond))
	_ = w.Flush()

	fmt.Fprintln(out)
	s, j := r.Server, r.Journal
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	var details []string
	check := func(what string, n int, ids []string) {
		verdict := "ok"
		if n != 0 {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\n", what, n, verdict)
		if n != 0 && len(ids) > 0 {
			more := ""
			if len(ids) > listed {
				more = fmt.Sprintf("\n  and %d more", len(ids)-listed)
				ids = ids[:listed]
			}
			details = append(details, fmt.Sprintf("%s:\n  %s%s", what, strings.Join(ids, "\n  "), more))
		}
	}
	lost := make([]string, len(s.Lost))
	for i, m := range s.Lost {
		lost[i] = fmt.Sprintf("%s (%q)", m.ID, m.Body)
	}
	var dups []string
	for src, answers := range s.DuplicateOf {
		dups = append(dups, fmt.Sprintf("%s answered by %s", src, strings.Join(answers, ", ")))
	}
	notDrained := 0
	if !r.Drained {
		notDrained = o.k - r.Answered
	}
	fmt.Fprintln(w, "CHECK\tCOUNT\tVERDICT")
	check("messages unanswered at the drain deadline", notDrained, nil)
	check("daemon exits the soak did not cause", len(r.Crashes), r.Crashes)
	stopFailed := 0
	if r.StopErr != nil {
		stopFailed = 1
	}
	check("orderly stop not exit 0 ("+exitText(r.StopErr)+")", stopFailed, nil)
	check("homeserver: messages sent but not in the room", len(s.Missing), s.Missing)
	check("homeserver: messages without an answer (lost)", len(s.Lost), lost)
	check("homeserver: answers beyond one per message (duplicated)", s.Duplicated, dups)
	check("homeserver: answers to no message of the person's", len(s.Stray), s.Stray)
	check("homeserver: answers without their reply's final marker", len(s.Unmarked), s.Unmarked)
	check("homeserver: answers not echoing their message", len(s.Misanswered), s.Misanswered)
	check("homeserver: answers outside their message's thread", len(s.Misplaced), s.Misplaced)
	check("homeserver: edits sent by the agent", s.AgentEdits, nil)
	check("homeserver: events the person's device could not decrypt", len(s.Undecrypted), r.Undecrypted)
	check("homeserver: messages sent in the clear into an encrypted room", len(s.Cleartext), s.Cleartext)
	check("homeserver: notices from the agent that a message's key never came", len(s.KeyNotices), s.KeyNotices)
	check("daemon: starts on another device than the first start's", r.OffDevice, r.Devices)
	check("journal: event IDs with more than one row", int(j.DuplicateIDs), nil)
	check("journal: events pending", int(j.Pending), nil)
	check("journal: replies queued or attempted, not acknowledged", int(j.Unacknowledged), nil)
	check("journal: replies failed", int(j.Failed), nil)
	check("journal: turns not delivered", int(j.OpenTurns), nil)
	check("journal: encrypted events still awaiting their keys", int(j.AwaitingKeys), nil)
	check("journal: encrypted events settled undecryptable", int(j.Undecryptable), nil)
	check("journal: room message events without a row", len(j.NotJournaled), j.NotJournaled)
	check("journal: messages admitted as context, not work", len(j.NotWork), j.NotWork)
	check("journal: answers the outbox does not record as acknowledged", len(j.OutboxMismatch), j.OutboxMismatch)
	_ = w.Flush()
	for _, d := range details {
		fmt.Fprintf(out, "\n%s\n", d)
	}

	fmt.Fprintf(out, "\n%d daemon starts, %d kills (the last %s after the first post), %d of them cutting an answer's send "+
		"while Dendrite took it in; the starts came up on device %s; %d answers in the room; posting took %s; "+
		"%d gaps in the person's sync filled from /messages; %d events the final /messages walk skipped and the sync showed\n",
		r.Starts, r.Kills, r.LastKill.Round(time.Millisecond), r.CutSends, strings.Join(r.Devices, ", "), len(s.Answers),
		r.Posted.Took.Round(time.Millisecond), r.Gaps, r.WalkSkipped)
	if r.Replicas > 1 {
		printKills(out, r)
	}
	fmt.Fprintf(out, "\nmindroomd status after the stop:\n%s", indent(r.Status, "  "))
	if r.passed() {
		fmt.Fprintln(out, "\nPASS")
	} else {
		fmt.Fprintf(out, "\nFAIL: logs and journal kept in %s\n", r.Dir)
	}
}

// printKills lists which replica each kill took, the agents it served and
// how long until they answered again, then sums the takeovers up.
func printKills(out io.Writer, r result) {
	if len(r.Killed) == 0 {
		fmt.Fprintf(out, "\nno replica was killed\n")
		return
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KILL\tAT\tREPLICA\tSERVING\tANSWERED AGAIN AFTER")
	for i, k := range r.Killed {
		again := "-"
		if k.Measured {
			again = k.Again.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i+1, k.At.Round(10*time.Millisecond), replicaName(k.Replica), agentList(k.Agents), again)
	}
	_ = w.Flush()
	p50, most, n := takeoverSummary(r.Killed)
	if n == 0 {
		fmt.Fprintf(out, "\nno kill's agents had anything left to answer after it\n")
		return
	}
	fmt.Fprintf(out, "\nthe killed replica's agents answered again after p50 %s, max %s (%d of %d kills; "+
		"the others took a replica serving no agent, or whose agents had nothing left to answer)\n",
		p50.Round(10*time.Millisecond), most.Round(10*time.Millisecond), n, len(r.Killed))
}

// takeoverSummary is the median and the longest of the measured kills'
// times until their agents answered again, and how many were measured.
func takeoverSummary(kills []kill) (p50, most time.Duration, n int) {
	var again []time.Duration
	for _, k := range kills {
		if k.Measured {
			again = append(again, k.Again)
		}
	}
	if len(again) == 0 {
		return 0, 0, 0
	}
	slices.Sort(again)
	// The nearest rank: the middle one, the lower of the middle two.
	return again[(len(again)-1)/2], again[len(again)-1], len(again)
}
