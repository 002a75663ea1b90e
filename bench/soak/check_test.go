package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/mx"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

const (
	testPerson = "@alice:localhost"
	testBot    = "@soak:localhost"
	testRoom   = "!room:localhost"
)

// reply is an answer of the bot's to source, as the daemon sends it: the
// reply relation (in the thread of root, when there is one) and the
// delivery marker of the source's reply.
func reply(id, source, root, body string) mx.Ev {
	rel := map[string]any{"m.in_reply_to": map[string]any{"event_id": source}}
	if root != "" {
		rel["rel_type"], rel["event_id"], rel["is_falling_back"] = "m.thread", root, true
	}
	e := mx.Message(id, testBot, 2000, body)
	c := e["content"].(map[string]any)
	c["m.relates_to"] = rel
	c[journal.DeliveryKey] = map[string]any{"delivery_id": journal.ReplyDeliveryID(source), "stage": "final"}
	return e
}

func raws(evs ...mx.Ev) []json.RawMessage {
	out := make([]json.RawMessage, len(evs))
	for i, e := range evs {
		out[i] = e.JSON()
	}
	return out
}

func TestTheRoomTallyFindsEveryLostDuplicatedAndMisplacedAnswer(t *testing.T) {
	msgs := []sent{
		{ID: "$m1", Body: "soak 1"},
		{ID: "$m2", Body: "soak 2, in the thread of 1", Root: "$m1"},
		{ID: "$m3", Body: "soak 3"},
		{ID: "$m4", Body: "soak 4"},
		{ID: "$m5", Body: "soak 5", Root: "$m1"},
		{ID: "$m6", Body: "soak 6"},
		{ID: "$m7", Body: "never arrived"},
	}
	unmarked := reply("$a6", "$m6", "", "echo: soak 6")
	unmarked["content"].(map[string]any)[journal.DeliveryKey] = map[string]any{"delivery_id": "reply:$m1", "stage": "final"}
	events := raws(
		mx.Message("$m1", testPerson, 1000, "soak 1"),
		mx.ThreadReply("$m2", testPerson, 1001, "$m1", "soak 2, in the thread of 1"),
		mx.Edit("$e1", testPerson, 1002, "$m1", "soak 1 (edited)"),
		mx.Message("$m3", testPerson, 1003, "soak 3"),
		mx.Message("$m4", testPerson, 1004, "soak 4"),
		mx.ThreadReply("$m5", testPerson, 1005, "$m1", "soak 5"),
		mx.Message("$m6", testPerson, 1006, "soak 6"),
		reply("$a1", "$m1", "", "echo: soak 1"),
		reply("$a2", "$m2", "$m1", "echo: soak 2, in the thread of 1"),
		reply("$a1b", "$m1", "", "echo: soak 1"),
		reply("$a1c", "$m1", "", "echo: soak 1"),
		reply("$a4", "$m4", "", "echo: something else"),
		reply("$a5", "$m5", "", "echo: soak 5"),
		unmarked,
		reply("$ax", "$e1", "", "echo: * soak 1 (edited)"),
		mx.Edit("$ae", testBot, 2001, "$a1", "echo: again"),
	)
	got := tallyRoom(events, testBot, msgs, false)

	if got.Originals != 6 || !slices.Equal(got.Missing, []string{"$m7"}) {
		t.Fatalf("originals %d, missing %v; want 6 and [$m7]", got.Originals, got.Missing)
	}
	if len(got.Lost) != 1 || got.Lost[0].ID != "$m3" {
		t.Fatalf("lost %v, want only $m3", got.Lost)
	}
	if got.Duplicated != 2 || !slices.Equal(got.DuplicateOf["$m1"], []string{"$a1", "$a1b", "$a1c"}) {
		t.Fatalf("duplicated %d %v, want 2 beyond $a1", got.Duplicated, got.DuplicateOf)
	}
	for name, c := range map[string]struct{ got, want []string }{
		"stray":       {got.Stray, []string{"$ax"}},
		"misanswered": {got.Misanswered, []string{"$a4"}},
		"misplaced":   {got.Misplaced, []string{"$a5"}},
		"unmarked":    {got.Unmarked, []string{"$a6"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %v, want %v", name, c.got, c.want)
		}
	}
	if got.AgentEdits != 1 {
		t.Errorf("agent edits %d, want 1", got.AgentEdits)
	}
}

func TestTheRoomTallyPassesOneAnswerPerMessage(t *testing.T) {
	msgs := []sent{{ID: "$m1", Body: "soak 1"}, {ID: "$m2", Body: "soak 2", Root: "$m1"}}
	events := raws(
		mx.Message("$m1", testPerson, 1000, "soak 1"),
		mx.ThreadReply("$m2", testPerson, 1001, "$m1", "soak 2"),
		reply("$a2", "$m2", "$m1", "echo: soak 2"),
		reply("$a1", "$m1", "", "echo: soak 1"),
	)
	got := tallyRoom(events, testBot, msgs, false)
	if got.Originals != 2 || len(got.Lost)+got.Duplicated+len(got.Stray)+len(got.Unmarked)+len(got.Misanswered)+len(got.Misplaced) != 0 {
		t.Fatalf("a clean room tallied as %+v", got)
	}
}

func TestAnAnswerListedTwiceInTheRoomsRecordIsOneAnswer(t *testing.T) {
	msgs := []sent{{ID: "$m1", Body: "soak 1"}}
	answer := reply("$a1", "$m1", "", "echo: soak 1")
	events := raws(mx.Message("$m1", testPerson, 1000, "soak 1"), answer, mx.Message("$m1", testPerson, 1000, "soak 1"), answer)
	if got := tallyRoom(events, testBot, msgs, false); got.Duplicated != 0 || got.Originals != 1 || len(got.Answers) != 1 {
		t.Fatalf("duplicated %d, originals %d, answers %d; want 0, 1, 1", got.Duplicated, got.Originals, len(got.Answers))
	}
}

// decrypted marks e as the person's device reads an event it decrypted.
func decrypted(e mx.Ev) mx.Ev {
	e[decryptedKey] = true
	return e
}

func TestAnEncryptedRoomsTallyFindsWhatDidNotDecryptWhatCameInTheClearAndKeyNotices(t *testing.T) {
	msgs := []sent{{ID: "$m1", Body: "soak 1"}, {ID: "$m2", Body: "soak 2"}, {ID: "$m3", Body: "soak 3"}}
	notice := decrypted(mx.Message("$n1", testBot, 2003, "a message's key never came"))
	notice["content"].(map[string]any)[journal.DeliveryKey] = map[string]any{
		"delivery_id": journal.KeyNotice(testRoom, "session").DeliveryID, "stage": "final"}
	events := raws(
		decrypted(mx.Message("$m1", testPerson, 1000, "soak 1")),
		decrypted(reply("$a1", "$m1", "", "echo: soak 1")),
		mx.Message("$m2", testPerson, 1001, "soak 2"),
		decrypted(reply("$a2", "$m2", "", "echo: soak 2")),
		decrypted(mx.Message("$m3", testPerson, 1002, "soak 3")),
		mx.Encrypted("$a3", testBot, 2002),
		notice,
	)
	got := tallyRoom(events, testBot, msgs, true)
	if !slices.Equal(got.Undecrypted, []string{"$a3"}) || !slices.Equal(got.Cleartext, []string{"$m2"}) ||
		!slices.Equal(got.KeyNotices, []string{"$n1"}) {
		t.Fatalf("undecrypted %v, in the clear %v, key notices %v; want [$a3], [$m2], [$n1]", got.Undecrypted, got.Cleartext, got.KeyNotices)
	}
	// An answer that did not decrypt is no answer; a key notice answers
	// nothing and is no stray answer.
	if len(got.Lost) != 1 || got.Lost[0].ID != "$m3" || len(got.Stray) != 0 || len(got.Answers) != 2 {
		t.Fatalf("lost %v, stray %v, %d answers; want $m3 lost, none stray, 2 answers", got.Lost, got.Stray, len(got.Answers))
	}
	if clear := tallyRoom(events, testBot, msgs, false); len(clear.Cleartext) != 0 {
		t.Fatalf("a room in the clear tallied %v as sent in the clear", clear.Cleartext)
	}
}

func TestTheDaemonsDevicesAreReadFromEachStartsLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mindroomd.log")
	log := `=== soak: start 1 at 2026-01-01T00:00:00Z
{"level":"info","agent":"soak","device_id":"FIRST","message":"End-to-end encryption ready"}
{"level":"info","agent":"soak","device_id":"FIRST","message":"Device keys uploaded"}
=== soak: start 2 at 2026-01-01T00:00:01Z
{"level":"info","agent":"soak","device_id":"FIRST","message":"End-to-end encryption ready"}
=== soak: start 3 at 2026-01-01T00:00:02Z
{"level":"info","agent":"soak","device_id":"OTHER","message":"End-to-end encryption ready"}
{"level":"info","agent":"soak","device_id":"FIRST","message":"End-to-end encryption re`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	devices, off, err := daemonDevices(path)
	if err != nil || !slices.Equal(devices, []string{"FIRST", "OTHER"}) || off != 1 {
		t.Fatalf("devices %v, %d off the first, error %v; want [FIRST OTHER], 1, none", devices, off, err)
	}
	if err := os.WriteFile(path, []byte("=== soak: start 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := daemonDevices(path); err == nil {
		t.Fatal("a log where no start named its device read without error")
	}
}

func TestTheRoomsRecordJoinsTheSyncAndTheWalkByEventID(t *testing.T) {
	synced := raws(mx.Message("$m1", testPerson, 1000, "one"), mx.Message("$m2", testPerson, 1001, "two"),
		mx.Message("$m1", testPerson, 1000, "one"))
	walked := raws(mx.Message("$m2", testPerson, 1001, "two"), mx.Message("$m3", testPerson, 1002, "three"),
		mx.Message("$m3", testPerson, 1002, "three"))
	var ids []string
	for _, raw := range union(synced, walked) {
		ev, err := parseEvent(raw)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.ID)
	}
	if want := []string{"$m1", "$m2", "$m3"}; !slices.Equal(ids, want) {
		t.Fatalf("record %v, want %v", ids, want)
	}
}

const testBot2 = "@soak2:localhost"

// answeredBy is reply's answer sent by bot instead of the soak's one agent.
func answeredBy(bot string, e mx.Ev) mx.Ev {
	e["sender"] = bot
	return e
}

func TestEachRoomsAnswersAnswerOnlyThatRoomsMessages(t *testing.T) {
	rooms := []roomRecord{
		{bot: testBot, msgs: []sent{{ID: "$m1", Body: "soak 1"}, {ID: "$m3", Body: "soak 3"}}, events: raws(
			mx.Message("$m1", testPerson, 1000, "soak 1"),
			mx.Message("$m3", testPerson, 1002, "soak 3"),
			reply("$a3", "$m3", "", "echo: soak 3"),
		)},
		{bot: testBot2, msgs: []sent{{ID: "$m2", Body: "soak 2"}, {ID: "$m4", Body: "soak 4"}}, events: raws(
			mx.Message("$m2", testPerson, 1001, "soak 2"),
			mx.Message("$m4", testPerson, 1003, "soak 4"),
			answeredBy(testBot2, reply("$a2", "$m2", "", "echo: soak 2")),
			answeredBy(testBot2, reply("$a2b", "$m2", "", "echo: soak 2")),
			answeredBy(testBot2, reply("$a4", "$m4", "", "echo: soak 4")),
			// Room 1's message answered here, by this room's agent: an
			// answer to nothing of this room's, and room 1's is lost.
			answeredBy(testBot2, reply("$a1", "$m1", "", "echo: soak 1")),
			// An answer from another room's agent answers nothing here.
			reply("$x4", "$m4", "", "echo: soak 4"),
		)},
	}
	total, byRoom := tallyRooms(rooms, false)
	if len(byRoom) != 2 || byRoom[0].Originals != 2 || byRoom[1].Originals != 2 {
		t.Fatalf("rooms tallied %+v", byRoom)
	}
	if total.Originals != 4 || len(total.Lost) != 1 || total.Lost[0].ID != "$m1" {
		t.Fatalf("originals %d, lost %v; want 4 and only $m1", total.Originals, total.Lost)
	}
	if total.Duplicated != 1 || !slices.Equal(total.DuplicateOf["$m2"], []string{"$a2", "$a2b"}) {
		t.Fatalf("duplicated %d %v, want 1 beyond $a2", total.Duplicated, total.DuplicateOf)
	}
	if !slices.Equal(total.Stray, []string{"$a1"}) || len(total.Answers) != 5 {
		t.Fatalf("stray %v, %d answers; want [$a1] and 5", total.Stray, len(total.Answers))
	}
	one, _ := tallyRooms(rooms[:1], false)
	if alone := tallyRoom(rooms[0].events, testBot, rooms[0].msgs, false); one.Originals != alone.Originals ||
		len(one.Lost) != len(alone.Lost) || len(one.Answers) != len(alone.Answers) {
		t.Fatalf("one room tallied as %+v, alone as %+v", one, alone)
	}
}

func TestTheReplicasFlagNeedsPostgreSQLAndGivesEachReplicaTwoAgents(t *testing.T) {
	for _, c := range []struct {
		args   []string
		agents int
		fails  bool
	}{
		{nil, 1, false},
		{[]string{"-pg"}, 1, false},
		{[]string{"-replicas", "1"}, 1, false},
		{[]string{"-pg", "-replicas", "3"}, 6, false},
		{[]string{"-replicas", "3"}, 0, true},
		{[]string{"-pg", "-replicas", "0"}, 0, true},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if (err != nil) != c.fails {
			t.Errorf("%v: error %v, want failure %v", c.args, err, c.fails)
			continue
		}
		if err == nil && o.agents() != c.agents {
			t.Errorf("%v: %d agents, want %d", c.args, o.agents(), c.agents)
		}
	}
	if got := agentNames(1); !slices.Equal(got, []string{agentName}) {
		t.Fatalf("one agent named %v, want [%s]", got, agentName)
	}
	if got := agentNames(3); !slices.Equal(got, []string{"soak1", "soak2", "soak3"}) {
		t.Fatalf("three agents named %v", got)
	}
}

func TestTheKillsTakeEveryReplicaAndOneDaemonAlways(t *testing.T) {
	if got := killTargets(rand.New(rand.NewPCG(7, 3)), 5, 1); !slices.Equal(got, make([]int, 5)) {
		t.Fatalf("one daemon's kills took %v", got)
	}
	got := killTargets(rand.New(rand.NewPCG(7, 3)), 30, 3)
	if again := killTargets(rand.New(rand.NewPCG(7, 3)), 30, 3); !slices.Equal(got, again) {
		t.Fatalf("one seed drew %v, then %v", got, again)
	}
	taken := map[int]int{}
	for _, r := range got {
		if r < 0 || r >= 3 {
			t.Fatalf("a kill took replica %d of 3", r)
		}
		taken[r]++
	}
	if len(taken) != 3 {
		t.Fatalf("30 kills took only the replicas %v", taken)
	}
}

func TestAKillsAgentsAnswerAgainAtTheirFirstAnswerAfterIt(t *testing.T) {
	answers := map[string][]answer{
		"soak1": {{ID: "$a", TS: 9_000}, {ID: "$b", TS: 12_500}, {ID: "$c", TS: 11_000}},
		"soak2": {{ID: "$d", TS: 10_400}, {ID: "$e", TS: 30_000}},
	}
	kills := []kill{
		{UnixMS: 10_000, Agents: []string{"soak1", "soak2"}},
		{UnixMS: 20_000, Agents: []string{"soak1", "soak2"}},
		{UnixMS: 20_000, Agents: []string{"soak1"}},
		{UnixMS: 25_000},
	}
	answeredAgain(kills, answers)
	for i, want := range []struct {
		again    time.Duration
		measured bool
	}{{time.Second, true}, {10 * time.Second, true}, {0, false}, {0, false}} {
		if kills[i].Again != want.again || kills[i].Measured != want.measured {
			t.Errorf("kill %d: again %s, measured %v; want %s, %v", i+1, kills[i].Again, kills[i].Measured, want.again, want.measured)
		}
	}
	kills = append(kills, kill{Measured: true, Again: 3 * time.Second})
	if p50, most, n := takeoverSummary(kills); p50 != 3*time.Second || most != 10*time.Second || n != 3 {
		t.Fatalf("p50 %s, max %s over %d; want 3s, 10s over 3", p50, most, n)
	}
	if _, _, n := takeoverSummary(kills[2:4]); n != 0 {
		t.Fatalf("%d kills measured of none", n)
	}
}

func TestEachAgentsDevicesAreCheckedAgainstItsOwnFirst(t *testing.T) {
	dir := t.TempDir()
	r1, r2 := filepath.Join(dir, "mindroomd-r1.log"), filepath.Join(dir, "mindroomd-r2.log")
	write := func(path, log string) {
		if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(r1, `{"level":"info","agent":"soak1","device_id":"ONE","message":"End-to-end encryption ready"}
{"level":"info","agent":"soak2","device_id":"TWO","message":"End-to-end encryption ready"}
`)
	write(r2, `{"level":"info","agent":"soak2","device_id":"TWO","message":"End-to-end encryption ready"}
{"level":"info","agent":"soak1","device_id":"ONE","message":"End-to-end encryption ready"}
`)
	devices, off, err := daemonDevices(r1, r2)
	if err != nil || !slices.Equal(devices, []string{"ONE", "TWO"}) || off != 0 {
		t.Fatalf("devices %v, %d off, error %v; want [ONE TWO], 0, none", devices, off, err)
	}
	write(r2, `{"level":"info","agent":"soak1","device_id":"TWO","message":"End-to-end encryption ready"}
`)
	if _, off, err := daemonDevices(r1, r2); err != nil || off != 1 {
		t.Fatalf("%d off, error %v; want the agent on another agent's device off", off, err)
	}
}

func TestEachReplicaHasItsOwnStorageAndNameAndTheOneKey(t *testing.T) {
	dir := t.TempDir()
	urlFile := filepath.Join(dir, "postgres.url")
	if err := os.WriteFile(urlFile, []byte("postgres://soak@127.0.0.1:5432/soak\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"-pg", "-replicas", "3", "-agent", "echo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	names := agentNames(o.agents())
	bots := make([]dendrite.Account, len(names))
	for i, name := range names {
		bots[i] = dendrite.Account{UserID: "@" + name + ":localhost", Password: "secret-" + name}
	}
	paths, err := writeConfig(dir, "http://127.0.0.1:8008", bots, names, o, "", urlFile)
	if err != nil || len(paths) != 3 {
		t.Fatalf("%d configurations, error %v; want 3", len(paths), err)
	}
	storages := map[string]bool{}
	for i, path := range paths {
		cfg, err := config.Load(path, func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Replicas != config.ReplicasAuto || cfg.ReplicaID != replicaName(i) || cfg.ReplicaTakeover != replicaTakeover ||
			cfg.PickleKeyFile != filepath.Join(dir, pickleKeyFile) || len(cfg.Agents) != 6 {
			t.Fatalf("replica %d: replicas %q, id %q, takeover %s, pickle key %s, %d agents", i+1,
				cfg.Replicas, cfg.ReplicaID, cfg.ReplicaTakeover, cfg.PickleKeyFile, len(cfg.Agents))
		}
		if _, _, log := replicaFiles(dir, o, i); storages[cfg.Storage] || filepath.Base(log) != "mindroomd-"+replicaName(i)+".log" {
			t.Fatalf("replica %d: storage %s shared, or log %s", i+1, cfg.Storage, log)
		}
		storages[cfg.Storage] = true
	}

	one := t.TempDir()
	o, err = parseFlags([]string{"-agent", "echo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	paths, err = writeConfig(one, "http://127.0.0.1:8008", bots[:1], agentNames(1), o, "", "")
	if err != nil || len(paths) != 1 || paths[0] != filepath.Join(one, "mindroom.yaml") {
		t.Fatalf("one daemon's configurations %v, error %v", paths, err)
	}
	cfg, err := config.Load(paths[0], func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replicas != "" || cfg.Storage != filepath.Join(one, "storage") || len(cfg.Agents) != 1 || cfg.Agents[0].Name != agentName {
		t.Fatalf("one daemon: replicas %q, storage %s, agents %+v", cfg.Replicas, cfg.Storage, cfg.Agents)
	}
}

// copyRow, moveCopy and insertCopied copy one event's journal row under a
// new seq, as an admission that failed to recognise the event would have.
// PostgreSQL's journal forbids a second row of an event outright, so its
// test drops that constraint first (dropIdentity) and copies the row in one
// statement, its seq a new one.
const (
	copyRow      = `CREATE TEMP TABLE copied AS SELECT * FROM journal_events WHERE event_id = ?`
	moveCopy     = `UPDATE copied SET seq = seq + 1000000`
	insertCopied = `INSERT INTO journal_events SELECT * FROM copied`
	dropIdentity = `ALTER TABLE journal_events DROP CONSTRAINT journal_events_principal_event_id_key`
	copyRowPG    = `INSERT INTO journal_events (principal, event_id, room_id, thread_id, target_id,
		kind, class, provenance, state, epoch, received_ms)
		SELECT principal, event_id, room_id, thread_id, target_id,
		kind, class, provenance, state, epoch, received_ms FROM journal_events WHERE event_id = $1`
)

// statement is one statement of a test's and its bound values.
type statement struct {
	sql  string
	args []any
}

// journalCase is a journal of one kind for the journal tally's test: where
// it is, how to open it for writing, and the statements that give an
// event a second row.
type journalCase struct {
	at        journalAt
	open      func(t *testing.T) journal.Store
	driver    string
	dsn       string
	duplicate []statement
}

func sqliteJournal(t *testing.T) journalCase {
	dir := t.TempDir()
	return journalCase{
		at:        journalAt{storage: dir},
		open:      func(t *testing.T) journal.Store { return testsupport.MustOpenAt(t, dir) },
		driver:    "sqlite3",
		dsn:       sqlitefs.Path(dir) + "?_busy_timeout=10000",
		duplicate: []statement{{copyRow, []any{"$m1"}}, {moveCopy, nil}, {insertCopied, nil}},
	}
}

func postgresJournal(t *testing.T) journalCase {
	url := pg.Start(t).Schema(t)
	return journalCase{
		at: journalAt{storage: t.TempDir(), pgURL: url},
		open: func(t *testing.T) journal.Store {
			s, err := store.Open(t.Context(), store.Options{DatabaseURL: url})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		driver:    "pgx",
		dsn:       url,
		duplicate: []statement{{dropIdentity, nil}, {copyRowPG, []any{"$m1"}}},
	}
}

// journalKinds are the journals the daemon keeps.
var journalKinds = []struct {
	name string
	of   func(*testing.T) journalCase
}{{"SQLite", sqliteJournal}, {"PostgreSQL", postgresJournal}}

func TestTheJournalTallyFindsPendingWorkAndEventsAdmittedTwice(t *testing.T) {
	for _, k := range journalKinds {
		t.Run(k.name, func(t *testing.T) { testJournalTally(t, k.of(t)) })
	}
}

// deleteEvents is a write the soak's reading session must refuse.
const deleteEvents = `DELETE FROM journal_events`

func TestTheSoaksJournalSessionRefusesWrites(t *testing.T) {
	for _, k := range journalKinds {
		t.Run(k.name, func(t *testing.T) {
			jc := k.of(t)
			s := jc.open(t)
			view, err := s.Principal(t.Context(), agentName, testBot)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := view.AdmitBatch(t.Context(), mx.Live(testRoom, mx.Message("$m1", testPerson, 1000, "soak 1")), "t1"); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := jc.at.open()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.ExecContext(t.Context(), deleteEvents); err == nil {
				t.Fatal("the reading session deleted the journal's events")
			}
			class, err := agentEvents(t.Context(), db, agentName)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := class["$m1"]; !ok {
				t.Fatal("the journal lost its event")
			}
		})
	}
}

func testJournalTally(t *testing.T, jc journalCase) {
	ctx := t.Context()
	s := jc.open(t)
	view, err := s.Principal(ctx, agentName, testBot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := view.AdmitBatch(ctx, mx.Live(testRoom,
		mx.Message("$m1", testPerson, 1000, "soak 1"),
		mx.Notice("$n1", testPerson, 1001, "a notice is never work"),
		mx.Edit("$e1", testPerson, 1002, "$m1", "soak 1 (edited)"),
	), "t1"); err != nil {
		t.Fatal(err)
	}
	// Ciphertext whose key never came, settled undecryptable, then
	// ciphertext still awaiting its key.
	for i, ev := range []mx.Ev{mx.Encrypted("$c1", testPerson, 1003), mx.Encrypted("$c2", testPerson, 1004)} {
		in := mx.Live(testRoom, ev)
		in[0].AwaitingSession = "s"
		if _, err := view.AdmitBatch(ctx, in, fmt.Sprintf("t%d", i+2)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if _, err := view.ExpireAwaiting(ctx, time.Now().Add(time.Hour).UnixMilli()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	msgs := []sent{{ID: "$m1"}, {ID: "$n1"}, {ID: "$m2"}}

	got, err := readJournal(ctx, jc.at, []agentShare{{agent: agentName, msgs: msgs, others: []string{"$e1", "$e2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Pending != 1 || got.DuplicateIDs != 0 || got.AwaitingKeys != 1 || got.Undecryptable != 1 {
		t.Fatalf("pending %d, duplicated IDs %d, awaiting keys %d, undecryptable %d; want 1, 0, 1, 1",
			got.Pending, got.DuplicateIDs, got.AwaitingKeys, got.Undecryptable)
	}
	if !slices.Equal(got.NotJournaled, []string{"$m2", "$e2"}) || !slices.Equal(got.NotWork, []string{"$n1"}) {
		t.Fatalf("not journaled %v, not work %v; want [$m2 $e2] and [$n1]", got.NotJournaled, got.NotWork)
	}

	db, err := sql.Open(jc.driver, jc.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// One connection: SQLite's copy is a temporary table of its own.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range jc.duplicate {
		if _, err := conn.ExecContext(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	if got, err = readJournal(ctx, jc.at, []agentShare{{agent: agentName, msgs: msgs}}); err != nil {
		t.Fatal(err)
	}
	if got.DuplicateIDs != 1 || got.DuplicateRows != 1 || got.Pending != 2 {
		t.Fatalf("duplicated IDs %d, rows %d, pending %d; want 1, 1, 2", got.DuplicateIDs, got.DuplicateRows, got.Pending)
	}
}
