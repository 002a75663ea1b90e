package sqlitefs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// sqlAllowed lists the SQL arguments that are not Go constants but are
// fixed when the binary is built, keyed by their function and expression
// as the guard reports them. Each needs a reason a reviewer can check.
var sqlAllowed = map[string]string{
	// A migration's text is one of the embedded migrations/*.sql files:
	// TestMigrationTextComesOnlyFromTheEmbeddedFiles checks that nothing
	// else writes the field.
	"github.com/mindroomd/mindroomd/sqlitefs.apply: m.SQL": "an embedded migration file",
	"github.com/mindroomd/mindroomd/pgfs.apply: m.SQL":     "an embedded migration file",
}

// sqlMethods are the names of the methods that take SQL text: database/sql's
// DB, Tx and Conn, the driver's SQLiteConn and any wrapper that keeps
// their names. The SQL is the first string parameter, or the second after
// a context.Context; a Stmt's methods take none and so are not sinks.
var sqlMethods = []string{"Exec", "ExecContext", "Query", "QueryContext", "QueryRow", "QueryRowContext",
	"Prepare", "PrepareContext"}

// integerFormatters render an integer as decimal digits: appended to a
// PRAGMA's constant text they make a pragma value, which SQLite cannot
// take as a bound parameter.
var integerFormatters = []string{"strconv.Itoa", "strconv.FormatInt", "strconv.FormatUint"}

// The module's production code passes SQL to the database only as text
// built from constants: a constant expression, a local variable or range
// variable that only ever holds such text, an integer formatted onto a
// PRAGMA's constant text (pragma values cannot be bound), or a parameter
// of a function whose every call in the module passes such text (the
// transaction wrappers of sqlitefs/tx.go and store/writer, and any helper
// like them, are checked at their callers). Test files are not scanned:
// their SQL is fixed test tables, and no input reaches it.
func TestSQLTextComesOnlyFromConstants(t *testing.T) {
	mod := loadModule(t)
	report := checkSQL(mod.fset, mod.packages)
	used := map[string]bool{}
	for _, v := range report.violations {
		if _, ok := sqlAllowed[v.key]; ok {
			used[v.key] = true
			continue
		}
		t.Errorf("%s: SQL text from %s (%s)", mod.rel(v.pos), v.expr, v.reason)
	}
	for key := range sqlAllowed {
		if !used[key] {
			t.Errorf("allowed SQL %q is no longer found: remove it from sqlAllowed", key)
		}
	}
	if report.checked < 50 {
		t.Errorf("only %d SQL call sites were checked; the guard no longer finds the module's SQL", report.checked)
	}
	t.Logf("%d SQL call sites checked; functions that pass a parameter on as SQL: %s", report.checked,
		strings.Join(report.sinkNames(), ", "))
}

// The guard finds each way of building SQL from something other than
// constants, and accepts each constant form, on a package written to
// exercise it: every line marked "flagged" must be reported, no other.
func TestTheSQLGuardFindsSQLBuiltFromVariables(t *testing.T) {
	const src = `package p

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
)

const q = "SELECT 1"
const setVersion = "PRAGMA user_version = "

var mutable = "SELECT 2"

var table = [...]string{0: q, 1: q + " LIMIT 1"}

var written = [...]string{q}

var sliced = [...]string{q}

var mapped = map[int]string{0: q, 1: mutable}

func spoil(i int) {
	written[i] = mutable
	_ = sliced[:]
}

type store struct{ db *sql.DB }

func (s store) run(query string, args ...any) error { _, err := s.db.Exec(query, args...); return err }

func lookup(db *sql.DB, table string) { db.Query("SELECT * FROM " + table) }

func orphan(db *sql.DB, query string) { db.Exec(query) } // flagged

func good(ctx context.Context, db *sql.DB, s store, n int) {
	db.ExecContext(ctx, q)
	db.QueryRow(q + " WHERE 1 = ?", n)
	s.run(q)
	lookup(db, "users")
	db.Exec(setVersion + strconv.Itoa(n))
	for _, x := range append([]string{q}, setVersion+"1") {
		db.Exec(x)
	}
	v := q
	if n > 0 {
		v = q + " LIMIT 1"
	}
	db.Exec(v)
	db.Prepare((q))
	db.Exec(table[n])
}

func bad(ctx context.Context, db *sql.DB, s store, n int) {
	name := os.Getenv("NAME")
	db.Exec("SELECT * FROM " + name) // flagged
	s.run(fmt.Sprintf("SELECT %d", n)) // flagged
	lookup(db, name) // flagged
	db.Exec(setVersion + name) // flagged
	db.Exec(q + strconv.Itoa(n)) // flagged
	db.QueryContext(ctx, mutable) // flagged
	qs := []string{q, name}
	for _, x := range qs {
		db.Exec(x) // flagged
	}
	x := q
	x = name
	db.Exec(x) // flagged
	y := q
	p := &y
	db.Exec(y) // flagged
	_ = p
	f := func(query string) { db.Exec(query) } // flagged
	f(q)
	db.Exec(written[n]) // flagged
	db.Exec(sliced[n]) // flagged
	db.Exec(mapped[n]) // flagged
	local := [...]string{q}
	db.Exec(local[n]) // flagged
}
`
	mod := loadModule(t)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := typeCheck(fset, "example.com/p", []*ast.File{f}, mod.importer(fset))
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for i, line := range strings.Split(src, "\n") {
		if strings.HasSuffix(line, "// flagged") {
			want = append(want, i+1)
		}
	}
	var got []int
	for _, v := range checkSQL(fset, []*checkedPackage{pkg}).violations {
		got = append(got, v.pos.Line)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("flagged lines %v, want %v", got, want)
	}
}

// The allowed migration text is provably fixed: migration.File's SQL is
// written only where migration.Load reads a file of the file system it is
// given, and each store gives it only its own embedded migrations.
func TestMigrationTextComesOnlyFromTheEmbeddedFiles(t *testing.T) {
	mod := loadModule(t)
	var pkg *checkedPackage
	for _, p := range mod.packages {
		if p.types.Path() == "github.com/mindroomd/mindroomd/migration" {
			pkg = p
		}
	}
	if pkg == nil {
		t.Fatal("package migration not loaded")
	}
	obj := pkg.types.Scope().Lookup("File")
	if obj == nil {
		t.Fatal("type migration.File not found")
	}
	st, ok := obj.Type().Underlying().(*types.Struct)
	if !ok {
		t.Fatal("migration.File is not a struct")
	}
	var field *types.Var
	for i := range st.NumFields() {
		if st.Field(i).Name() == "SQL" {
			field = st.Field(i)
		}
	}
	if field == nil {
		t.Fatal("migration.File has no SQL field")
	}
	// Outside package migration the field may be read, never written: a
	// composite literal, an assignment or its address anywhere else fails.
	writes := 0
	for _, p := range mod.packages {
		for _, f := range p.files {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.KeyValueExpr:
						if id, ok := x.Key.(*ast.Ident); ok && p.info.Uses[id] == field {
							writes++
							if p != pkg || fn.Name.Name != "Load" || types.ExprString(x.Value) != "string(body)" {
								t.Errorf("%s: migration.File.SQL written from %s in %s", mod.rel(mod.fset.Position(x.Pos())),
									types.ExprString(x.Value), fn.Name.Name)
							}
						}
					case *ast.AssignStmt:
						for _, lhs := range x.Lhs {
							if sel, ok := lhs.(*ast.SelectorExpr); ok && p.info.Uses[sel.Sel] == field {
								t.Errorf("%s: migration.File.SQL assigned", mod.rel(mod.fset.Position(x.Pos())))
							}
						}
					case *ast.UnaryExpr:
						if sel, ok := x.X.(*ast.SelectorExpr); ok && x.Op == token.AND && p.info.Uses[sel.Sel] == field {
							t.Errorf("%s: migration.File.SQL's address taken", mod.rel(mod.fset.Position(x.Pos())))
						}
					}
					return true
				})
			}
		}
	}
	if writes != 1 {
		t.Errorf("migration.File.SQL is written in %d composite literals, want the one in Load", writes)
	}
	load, err := os.ReadFile("../migration/migration.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(load, []byte("body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))")) {
		t.Error("Load no longer reads body from the file system it is given")
	}
	for _, source := range []string{"migrate.go", "../pgfs/migrate.go"} {
		src, err := os.ReadFile(source)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(src, []byte("//go:embed migrations/*.sql\nvar migrationFS embed.FS")) ||
			!bytes.Contains(src, []byte(`migration.Load(migrationFS, "migrations")`)) {
			t.Errorf("%s no longer loads its migrations from its embedded migrationFS alone", source)
		}
	}
}

// checkedPackage is one type-checked package of the module.
type checkedPackage struct {
	types *types.Package
	info  *types.Info
	files []*ast.File
}

// sourceModule is the module's production packages, type-checked from source
// against the export data of their dependencies.
type sourceModule struct {
	root     string
	fset     *token.FileSet
	packages []*checkedPackage
	exports  map[string]string
}

func (m *sourceModule) rel(pos token.Position) string {
	if r, err := filepath.Rel(m.root, pos.Filename); err == nil {
		pos.Filename = r
	}
	return pos.String()
}

// importer reads dependencies from the export data go list reported.
func (m *sourceModule) importer(fset *token.FileSet) types.Importer {
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := m.exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}

var (
	moduleOnce   sync.Once
	moduleLoaded *sourceModule
	moduleErr    error
)

// loadModule lists the module's packages and their dependencies with go
// list (building export data where the build cache lacks it), then
// type-checks each of the module's packages from its source.
func loadModule(t *testing.T) *sourceModule {
	t.Helper()
	moduleOnce.Do(func() { moduleLoaded, moduleErr = loadSource() })
	if moduleErr != nil {
		t.Fatal(moduleErr)
	}
	return moduleLoaded
}

func loadSource() (*sourceModule, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-export", "-compiled", "-deps",
		"-json=ImportPath,Dir,GoFiles,CompiledGoFiles,CgoFiles,Export,Module,Error", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, stderr.String())
	}
	type listed struct {
		ImportPath      string
		Dir             string
		GoFiles         []string
		CompiledGoFiles []string
		CgoFiles        []string
		Export          string
		Module          *struct{ Path string }
		Error           *struct{ Err string }
	}
	m := &sourceModule{root: root, fset: token.NewFileSet(), exports: map[string]string{}}
	var own []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		m.exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path == "github.com/mindroomd/mindroomd" {
			own = append(own, p)
		}
	}
	imp := m.importer(m.fset)
	for _, p := range own {
		// A cgo package is read as cgo rewrote it; its line directives
		// still name the original file.
		names := p.GoFiles
		if len(p.CgoFiles) > 0 {
			names = p.CompiledGoFiles
		}
		var files []*ast.File
		for _, name := range names {
			if !filepath.IsAbs(name) {
				name = filepath.Join(p.Dir, name)
			}
			f, err := parser.ParseFile(m.fset, name, nil, parser.ParseComments)
			if err != nil {
				return nil, err
			}
			files = append(files, f)
		}
		pkg, err := typeCheck(m.fset, p.ImportPath, files, imp)
		if err != nil {
			return nil, err
		}
		m.packages = append(m.packages, pkg)
	}
	return m, nil
}

func typeCheck(fset *token.FileSet, path string, files []*ast.File, imp types.Importer) (*checkedPackage, error) {
	info := &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	var errs []error
	conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err) }}
	pkg, _ := conf.Check(path, fset, files, info)
	if len(errs) > 0 {
		return nil, fmt.Errorf("type-check %s: %w", path, errors.Join(errs...))
	}
	return &checkedPackage{types: pkg, info: info, files: files}, nil
}

// sqlViolation is SQL text the guard cannot show is built from constants.
type sqlViolation struct {
	pos    token.Position
	key    string // the function's full name and the expression, for sqlAllowed
	expr   string
	reason string
}

// sqlReport is what checkSQL found.
type sqlReport struct {
	violations []sqlViolation
	checked    int
	sinks      map[string]map[int]bool
}

func (r sqlReport) sinkNames() []string {
	var names []string
	for name := range r.sinks {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// sqlCall is one call of a function or method, where it is made.
type sqlCall struct {
	pkg    *checkedPackage
	expr   *ast.CallExpr
	callee *types.Func
	// scope is the innermost function the call is in: a FuncDecl or a
	// FuncLit; decl is the declared function around it.
	scope ast.Node
	decl  *types.Func
}

// checkSQL finds the SQL arguments of pkgs that are not built from
// constants.
func checkSQL(fset *token.FileSet, pkgs []*checkedPackage) sqlReport {
	var calls []sqlCall
	for _, pkg := range pkgs {
		for _, f := range pkg.files {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				decl, _ := pkg.info.Defs[fn.Name].(*types.Func)
				collectCalls(pkg, fn, fn, decl, &calls)
			}
		}
	}
	// Functions that pass a parameter on as SQL are sinks in their turn,
	// checked where they are called, until no new one appears.
	r := sqlReport{sinks: map[string]map[int]bool{}}
	for changed := true; changed; {
		changed = false
		for _, c := range calls {
			for _, i := range sqlArgs(c, r.sinks) {
				res := sqlSafe(c, c.expr.Args[i])
				if !res.ok || c.decl == nil {
					continue
				}
				name := c.decl.Origin().FullName()
				for _, p := range res.params {
					if p < 0 {
						continue
					}
					if r.sinks[name] == nil {
						r.sinks[name] = map[int]bool{}
					}
					if !r.sinks[name][p] {
						r.sinks[name][p], changed = true, true
					}
				}
			}
		}
	}
	called := map[string]bool{}
	for _, c := range calls {
		called[c.callee.Origin().FullName()] = true
	}
	for _, c := range calls {
		for _, i := range sqlArgs(c, r.sinks) {
			r.checked++
			arg := c.expr.Args[i]
			res := sqlSafe(c, arg)
			switch {
			case !res.ok:
			case len(res.params) == 0:
				continue
			case slices.Contains(res.params, -1):
				res.reason = "a parameter of a function literal, whose callers cannot be checked"
			case !called[c.decl.Origin().FullName()] && !isSQLMethod(c.decl):
				res.reason = "a parameter of a function nothing in the module calls, so no caller is checked"
			default:
				continue
			}
			fnName := "package level"
			if c.decl != nil {
				fnName = c.decl.Origin().FullName()
			}
			expr := types.ExprString(arg)
			r.violations = append(r.violations, sqlViolation{pos: fset.Position(arg.Pos()), key: fnName + ": " + expr,
				expr: expr, reason: res.reason})
		}
	}
	return r
}

// collectCalls records every call in n with a known callee.
func collectCalls(pkg *checkedPackage, n ast.Node, scope ast.Node, decl *types.Func, calls *[]sqlCall) {
	ast.Inspect(n, func(x ast.Node) bool {
		switch e := x.(type) {
		case *ast.FuncLit:
			if e != n {
				collectCalls(pkg, e.Body, e, decl, calls)
				return false
			}
		case *ast.CallExpr:
			if fn := calleeOf(pkg.info, e); fn != nil {
				*calls = append(*calls, sqlCall{pkg: pkg, expr: e, callee: fn, scope: scope, decl: decl})
			}
		}
		return true
	})
}

func calleeOf(info *types.Info, e *ast.CallExpr) *types.Func {
	var obj types.Object
	switch f := ast.Unparen(e.Fun).(type) {
	case *ast.Ident:
		obj = info.Uses[f]
	case *ast.SelectorExpr:
		if sel := info.Selections[f]; sel != nil {
			obj = sel.Obj()
		} else {
			obj = info.Uses[f.Sel]
		}
	}
	fn, _ := obj.(*types.Func)
	return fn
}

// isSQLMethod reports a method whose name and signature say it takes SQL.
func isSQLMethod(fn *types.Func) bool { return sqlParam(fn) >= 0 }

// sqlParam is the index of fn's SQL parameter, or -1 if it has none.
func sqlParam(fn *types.Func) int {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil || !slices.Contains(sqlMethods, fn.Name()) {
		return -1
	}
	params := sig.Params()
	isString := func(i int) bool {
		b, ok := params.At(i).Type().(*types.Basic)
		return ok && b.Kind() == types.String
	}
	switch {
	case params.Len() > 0 && isString(0):
		return 0
	case params.Len() > 1 && types.TypeString(params.At(0).Type(), nil) == "context.Context" && isString(1):
		return 1
	}
	return -1
}

// sqlArgs are the indexes of c's arguments that are SQL text.
func sqlArgs(c sqlCall, sinks map[string]map[int]bool) []int {
	var idx []int
	if i := sqlParam(c.callee); i >= 0 {
		idx = append(idx, i)
	}
	for i := range sinks[c.callee.Origin().FullName()] {
		if !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	var in []int
	for _, i := range idx {
		if i < len(c.expr.Args) && (c.expr.Ellipsis == token.NoPos || i < len(c.expr.Args)-1) {
			in = append(in, i)
		}
	}
	slices.Sort(in)
	return in
}

// safety is the verdict on one expression: whether it is built from
// constants, given the parameters it takes its text from.
type safety struct {
	ok     bool
	params []int
	reason string
}

func notConstant(format string, args ...any) safety {
	return safety{reason: fmt.Sprintf(format, args...)}
}

func both(a, b safety) safety {
	if !a.ok {
		return a
	}
	if !b.ok {
		return b
	}
	return safety{ok: true, params: append(slices.Clone(a.params), b.params...)}
}

// sqlSafe judges the SQL argument e of call c.
func sqlSafe(c sqlCall, e ast.Expr) safety {
	return (&judge{c: c, seen: map[*types.Var]bool{}}).expr(e)
}

// judge follows one argument back through the variables it is made of.
type judge struct {
	c    sqlCall
	seen map[*types.Var]bool
}

func (j *judge) expr(e ast.Expr) safety {
	info := j.c.pkg.info
	if tv, ok := info.Types[e]; ok && tv.Value != nil {
		return safety{ok: true}
	}
	switch x := e.(type) {
	case *ast.ParenExpr:
		return j.expr(x.X)
	case *ast.BinaryExpr:
		if x.Op != token.ADD {
			return notConstant("the operator %s", x.Op)
		}
		if j.pragmaValue(x) {
			return safety{ok: true}
		}
		return both(j.expr(x.X), j.expr(x.Y))
	case *ast.Ident:
		v, ok := info.Uses[x].(*types.Var)
		if !ok {
			return notConstant("%s, not a constant", x.Name)
		}
		return j.variable(v)
	case *ast.IndexExpr:
		return j.table(x)
	case *ast.CallExpr:
		return notConstant("the result of a call")
	case *ast.SelectorExpr:
		return notConstant("a field or package variable")
	}
	return notConstant("a non-constant %T", e)
}

// table accepts an element of a statement table: a package-level array
// whose declaration lists only constant text (a dialect's statements,
// indexed by the statement's name) and which nothing in its package
// writes, slices or takes the address of.
func (j *judge) table(x *ast.IndexExpr) safety {
	info := j.c.pkg.info
	id, ok := ast.Unparen(x.X).(*ast.Ident)
	if !ok {
		return notConstant("an element of a computed collection")
	}
	v, ok := info.Uses[id].(*types.Var)
	if !ok || v.Pkg() == nil || v.Parent() != v.Pkg().Scope() {
		return notConstant("an element of %s, not a package-level table", id.Name)
	}
	if _, isArray := v.Type().Underlying().(*types.Array); !isArray {
		return notConstant("an element of %s, which is not an array", id.Name)
	}
	var decl *ast.CompositeLit
	is := func(e ast.Expr) bool {
		i, ok := ast.Unparen(e).(*ast.Ident)
		return ok && (info.Uses[i] == v || info.Defs[i] == v)
	}
	written := false
	for _, f := range j.c.pkg.files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch y := n.(type) {
			case *ast.ValueSpec:
				for i, name := range y.Names {
					if info.Defs[name] == v && i < len(y.Values) {
						decl, _ = ast.Unparen(y.Values[i]).(*ast.CompositeLit)
					}
				}
			case *ast.AssignStmt:
				for _, lhs := range y.Lhs {
					if ix, ok := lhs.(*ast.IndexExpr); ok && is(ix.X) || is(lhs) {
						written = true
					}
				}
			case *ast.UnaryExpr:
				if ix, ok := y.X.(*ast.IndexExpr); y.Op == token.AND && (is(y.X) || ok && is(ix.X)) {
					written = true
				}
			case *ast.SliceExpr:
				written = written || is(y.X)
			}
			return true
		})
	}
	if decl == nil || written {
		return notConstant("an element of %s, a table that is not fixed", id.Name)
	}
	return j.elements(decl)
}

// pragmaValue accepts a PRAGMA's constant text followed by an integer
// formatted as decimal digits.
func (j *judge) pragmaValue(x *ast.BinaryExpr) bool {
	tv, ok := j.c.pkg.info.Types[x.X]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String ||
		!strings.HasPrefix(strings.ToUpper(strings.TrimSpace(constant.StringVal(tv.Value))), "PRAGMA ") {
		return false
	}
	call, ok := x.Y.(*ast.CallExpr)
	if !ok {
		return false
	}
	fn := calleeOf(j.c.pkg.info, call)
	return fn != nil && fn.Pkg() != nil && slices.Contains(integerFormatters, fn.Pkg().Path()+"."+fn.Name())
}

// variable judges every value v may hold: a parameter of the declared
// function is passed on to its callers; a local variable must only ever
// be given text built from constants.
func (j *judge) variable(v *types.Var) safety {
	if j.seen[v] {
		return safety{ok: true} // its other values decide
	}
	j.seen[v] = true
	body := j.body()
	if j.c.decl != nil {
		params := j.c.decl.Type().(*types.Signature).Params()
		for i := range params.Len() {
			if params.At(i) == v {
				return both(safety{ok: true, params: []int{i}}, j.assignments(body, v))
			}
		}
	}
	if lit, ok := j.c.scope.(*ast.FuncLit); ok {
		for _, f := range lit.Type.Params.List {
			for _, name := range f.Names {
				if j.c.pkg.info.Defs[name] == v {
					return safety{ok: true, params: []int{-1}}
				}
			}
		}
	}
	if body == nil || v.Pos() < body.Pos() || v.Pos() >= body.End() {
		return notConstant("%s, a variable from outside the function", v.Name())
	}
	return j.assignments(body, v)
}

// body is the body of the declared function around the call, which holds
// every assignment to its local variables (closures included).
func (j *judge) body() *ast.BlockStmt {
	for _, f := range j.c.pkg.files {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && j.c.pkg.info.Defs[fn.Name] == j.c.decl {
				return fn.Body
			}
		}
	}
	return nil
}

// assignments judges every value body gives v.
func (j *judge) assignments(body *ast.BlockStmt, v *types.Var) safety {
	info := j.c.pkg.info
	is := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && (info.Defs[id] == v || info.Uses[id] == v)
	}
	res := safety{ok: true}
	ast.Inspect(body, func(n ast.Node) bool {
		if !res.ok {
			return false
		}
		switch x := n.(type) {
		case *ast.AssignStmt:
			for i, lhs := range x.Lhs {
				if !is(lhs) {
					continue
				}
				if len(x.Lhs) != len(x.Rhs) {
					res = notConstant("%s, given a value of a call with several results", v.Name())
					return false
				}
				res = both(res, j.expr(x.Rhs[i]))
			}
		case *ast.ValueSpec:
			for i, name := range x.Names {
				if info.Defs[name] != v || len(x.Values) == 0 {
					continue
				}
				if len(x.Values) != len(x.Names) {
					res = notConstant("%s, given a value of a call with several results", v.Name())
					return false
				}
				res = both(res, j.expr(x.Values[i]))
			}
		case *ast.RangeStmt:
			if x.Key != nil && is(x.Key) {
				res = notConstant("%s, a range key", v.Name())
			} else if x.Value != nil && is(x.Value) {
				res = both(res, j.elements(x.X))
			}
		case *ast.UnaryExpr:
			if x.Op == token.AND && is(x.X) {
				res = notConstant("%s, whose address is taken", v.Name())
			}
		}
		return true
	})
	return res
}

// elements judges the elements of a collection a range walks.
func (j *judge) elements(e ast.Expr) safety {
	info := j.c.pkg.info
	switch x := ast.Unparen(e).(type) {
	case *ast.CompositeLit:
		res := safety{ok: true}
		for _, el := range x.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				el = kv.Value
			}
			res = both(res, j.expr(el))
		}
		return res
	case *ast.CallExpr:
		if id, ok := ast.Unparen(x.Fun).(*ast.Ident); ok && id.Name == "append" && len(x.Args) > 0 {
			if _, builtin := info.Uses[id].(*types.Builtin); builtin {
				res := j.elements(x.Args[0])
				for i, a := range x.Args[1:] {
					if x.Ellipsis != token.NoPos && i == len(x.Args)-2 {
						res = both(res, j.elements(a))
					} else {
						res = both(res, j.expr(a))
					}
				}
				return res
			}
		}
		return notConstant("a collection returned by a call")
	case *ast.Ident:
		v, ok := info.Uses[x].(*types.Var)
		if !ok {
			return notConstant("%s", x.Name)
		}
		if j.seen[v] {
			return safety{ok: true}
		}
		j.seen[v] = true
		body := j.body()
		if body == nil || v.Pos() < body.Pos() || v.Pos() >= body.End() {
			return notConstant("%s, a collection from outside the function", v.Name())
		}
		return j.collection(body, v)
	}
	return notConstant("a collection of unknown content")
}

// collection judges every value body gives the collection v, element by
// element; any other use that could change it (an index assignment, its
// address) makes it unknown.
func (j *judge) collection(body *ast.BlockStmt, v *types.Var) safety {
	info := j.c.pkg.info
	is := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && (info.Defs[id] == v || info.Uses[id] == v)
	}
	res := safety{ok: true}
	ast.Inspect(body, func(n ast.Node) bool {
		if !res.ok {
			return false
		}
		switch x := n.(type) {
		case *ast.AssignStmt:
			for i, lhs := range x.Lhs {
				if ix, ok := lhs.(*ast.IndexExpr); ok && is(ix.X) {
					res = notConstant("%s, whose elements are assigned", v.Name())
					return false
				}
				if !is(lhs) {
					continue
				}
				if len(x.Lhs) != len(x.Rhs) {
					res = notConstant("%s, given a value of a call with several results", v.Name())
					return false
				}
				res = both(res, j.elements(x.Rhs[i]))
			}
		case *ast.ValueSpec:
			for i, name := range x.Names {
				if info.Defs[name] == v && i < len(x.Values) {
					res = both(res, j.elements(x.Values[i]))
				}
			}
		case *ast.UnaryExpr:
			if x.Op == token.AND && is(x.X) {
				res = notConstant("%s, whose address is taken", v.Name())
			}
		}
		return true
	})
	return res
}
