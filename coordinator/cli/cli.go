// Package cli is gpuaasctl, the operator command line for the gpuaas
// coordinator API: allocations, nodes, slots, topology, availability,
// tasks, usage, regions and pools, and the Raft peer set. Output is an
// aligned table by default and the API's JSON with -o json. API errors
// are printed with their stable code and request ID, and the command
// exits non-zero.
//
// The API address comes from --addr or GPUAAS_ADDR (default
// https://127.0.0.1:7300, the coordinator's default listener; a bare
// host:port means https); the cluster CA it trusts from --ca-file or
// GPUAAS_CA_FILE (the lab writes .lab/ca.pem); the bearer token from
// --token, --token-file, GPUAAS_TOKEN or GPUAAS_TOKEN_FILE.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// DefaultAddr is the coordinator's default API listener.
const DefaultAddr = "https://127.0.0.1:7300"

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the API refused, or it could not be reached
	ExitUsage = 2 // bad command line
)

// usageError marks a command-line mistake (exit 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Env is the process environment the CLI reads (os.Getenv in main).
type Env func(string) string

// app carries the global options of one invocation.
type app struct {
	in          io.Reader // nil: os.Stdin
	out, errOut io.Writer
	env         Env
	http        *http.Client

	addr, token, tokenFile, output string
	caFile                         string
	timeout                        time.Duration
	consistent                     bool
}

// Run executes gpuaasctl with args and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, env Env) int {
	return RunWithClient(ctx, args, stdout, stderr, env, nil)
}

// RunWithStdin is RunWithClient reading interactive input (alloc console)
// from stdin.
func RunWithStdin(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env Env, hc *http.Client) int {
	a := &app{in: stdin, out: stdout, errOut: stderr, env: env, http: hc}
	return a.run(ctx, args, stdout, stderr)
}

// RunWithClient is Run with an explicit HTTP client (nil: a default one).
func RunWithClient(ctx context.Context, args []string, stdout, stderr io.Writer, env Env, hc *http.Client) int {
	a := &app{out: stdout, errOut: stderr, env: env, http: hc}
	return a.run(ctx, args, stdout, stderr)
}

func (a *app) run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := a.root()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var pe *ProblemError
	var ue usageError
	switch {
	case errors.As(err, &pe):
		fmt.Fprintf(stderr, "Error: %s (%s, HTTP %d)\n  %s\n", pe.Title, pe.Code, pe.Status, pe.Detail)
		if pe.RequestID != "" {
			fmt.Fprintf(stderr, "  request id: %s\n", pe.RequestID)
		}
		return ExitError
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "Error: %v\nRun 'gpuaasctl --help' for usage.\n", err)
		return ExitUsage
	case strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") ||
		strings.HasPrefix(err.Error(), "unknown shorthand flag") || strings.Contains(err.Error(), "flag needs an argument"):
		fmt.Fprintf(stderr, "Error: %v\nRun 'gpuaasctl --help' for usage.\n", err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return ExitError
	}
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpuaasctl",
		Short:         "Operate a gpuaas coordinator: allocations, nodes, slots, capacity and Raft peers",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "table", "json":
			default:
				return usagef("-o %q: use table or json", a.output)
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{plainFlagError(err)} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.addr, "addr", "", "coordinator API address (env GPUAAS_ADDR; default "+DefaultAddr+")")
	pf.StringVar(&a.token, "token", "", "bearer token (env GPUAAS_TOKEN)")
	pf.StringVar(&a.caFile, "ca-file", "", "PEM file of the cluster CA the API's certificate is checked against (env GPUAAS_CA_FILE; the lab's is .lab/ca-bundle.pem, kept current through a CA rotation; default: the system roots)")
	pf.StringVar(&a.tokenFile, "token-file", "", "file holding the bearer token (env GPUAAS_TOKEN_FILE)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&a.timeout, "timeout", 30*time.Second, "timeout of each API call")
	pf.BoolVar(&a.consistent, "consistent", false, "read through the leader (Raft barrier) instead of the local replica")

	root.AddCommand(a.allocCmd(), a.nodeCmd(), a.slotCmd(), a.topologyCmd(), a.availabilityCmd(),
		a.tasksCmd(), a.usageCmd(), a.regionCmd(), a.poolCmd(), a.operatorCmd(), a.statusCmd(), a.tokenCmd(),
		a.workflowCmd(), a.siteCmd(), a.bundleCmd(), a.auditCmd(), a.caCmd())
	root.AddCommand(a.imageCmd(), a.appCmd())
	return root
}

// client builds the API client from flags and environment.
func (a *app) client() (*Client, error) {
	base, err := ParseAddr(a.apiAddr())
	if err != nil {
		return nil, usageError{err}
	}
	tok, err := a.resolveToken()
	if err != nil {
		return nil, err
	}
	hc := a.http
	if hc == nil {
		caFile := a.caFile
		if caFile == "" {
			caFile = a.env("GPUAAS_CA_FILE")
		}
		if caFile != "" {
			if hc, err = HTTPClient(caFile); err != nil {
				return nil, usageError{err}
			}
		}
	}
	return &Client{Base: base, Token: tok, HTTP: hc}, nil
}

// apiAddr is the API address the flags and environment name: --addr,
// else GPUAAS_ADDR, else DefaultAddr.
func (a *app) apiAddr() string {
	if a.addr != "" {
		return a.addr
	}
	if addr := a.env("GPUAAS_ADDR"); addr != "" {
		return addr
	}
	return DefaultAddr
}

func (a *app) resolveToken() (string, error) {
	if a.token != "" {
		return a.token, nil
	}
	file := a.tokenFile
	if file == "" {
		if t := a.env("GPUAAS_TOKEN"); t != "" {
			return t, nil
		}
		file = a.env("GPUAAS_TOKEN_FILE")
	}
	if file == "" {
		return "", usagef("no token: set --token, --token-file, GPUAAS_TOKEN or GPUAAS_TOKEN_FILE")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return t, nil
}

// call runs one API request with the per-call timeout.
func (a *app) call(cmd *cobra.Command, method, path string, q map[string]string, body any, hdr http.Header) (*Response, error) {
	c, err := a.client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
	defer cancel()
	vals := map[string][]string{}
	for k, v := range q {
		if v != "" {
			vals[k] = []string{v}
		}
	}
	if method == http.MethodGet && a.consistent {
		vals["consistent"] = []string{"true"}
	}
	// Read-your-writes on any replica (ryw.go).
	minIndex := uint64(0)
	if method == http.MethodGet && !a.consistent && vals["index"] == nil && vals["min_index"] == nil {
		minIndex = a.lastWriteIndex(c.Token)
	}
	if minIndex > 0 {
		vals["min_index"] = []string{strconv.FormatUint(minIndex, 10)}
	}
	r, err := a.retryLoop(ctx, method, hdr, func() (*Response, error) { return c.Do(ctx, method, path, vals, body, hdr) })
	if minIndex > 0 && behindMinIndex(err) {
		// The cluster never reached it: not this cluster's index.
		a.rememberWrite(c.Token, 0, true)
		delete(vals, "min_index")
		r, err = a.retryLoop(ctx, method, hdr, func() (*Response, error) { return c.Do(ctx, method, path, vals, body, hdr) })
	}
	if idx := writeIndex(method, r); err == nil && idx > 0 {
		a.rememberWrite(c.Token, idx, false)
	}
	return r, err
}

// show prints a response: pretty JSON with -o json, else table(v).
func show[T any](a *app, r *Response, table func(w *tabwriter.Writer, v T)) error {
	if a.output == "json" {
		var raw json.RawMessage = r.Body
		b, err := json.MarshalIndent(raw, "", "  ")
		if err != nil {
			return fmt.Errorf("format answer: %w", err)
		}
		_, err = fmt.Fprintln(a.out, string(b))
		return err
	}
	v, err := decode[T](r)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	table(w, v)
	return w.Flush()
}

// row writes tab-separated cells.
func row(w io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(w, "\t")
		}
		s := fmt.Sprint(c)
		if s == "" {
			s = "-"
		}
		fmt.Fprint(w, s)
	}
	fmt.Fprintln(w)
}

func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func tsp(t *time.Time) string {
	if t == nil {
		return ""
	}
	return ts(*t)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// exactArgs is cobra.ExactArgs with a usage error naming the arguments.
// plainFlagError rewrites pflag's number and boolean parse errors
// ('invalid argument "abc" for "--gpus" flag: strconv.ParseInt: parsing
// "abc": invalid syntax') into what was wanted.
func plainFlagError(err error) error {
	msg := err.Error()
	i := strings.Index(msg, ": strconv.Parse")
	if i < 0 {
		return err
	}
	want := "a whole number"
	switch {
	case strings.HasPrefix(msg[i:], ": strconv.ParseBool"):
		want = "true or false"
	case strings.HasPrefix(msg[i:], ": strconv.ParseFloat"):
		want = "a number"
	case strings.Contains(msg[i:], "value out of range"):
		want = "a smaller number"
	}
	return errors.New(msg[:i] + ": want " + want)
}

func exactArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef("expected %d argument(s): %s; got %d", len(names), strings.Join(names, " "), len(args))
		}
		// Every positional but a file path names something the API
		// bounds at proto.MaxIDLength: say so here rather than send (and
		// echo back) an oversized URL.
		for i, name := range names {
			if name != "FILE" && len(args[i]) > proto.MaxIDLength {
				return usagef("%s is %d characters long; at most %d are allowed", name, len(args[i]), proto.MaxIDLength)
			}
		}
		return nil
	}
}

// nextHint tells a table reader how to get the next page.
func nextHint(a *app, next string) {
	if next != "" {
		fmt.Fprintf(a.errOut, "more: pass --after %s\n", next)
	}
}

// pageUsage is what a paged command's --after and --limit say in its help.
type pageUsage struct{ after, limit string }

// plainPage is the usage most list commands give their page flags.
var plainPage = pageUsage{after: "page cursor", limit: "page size"}

// limitUsage is the --limit usage that gives the server's bounds.
const limitUsage = "page size (server default 100, at most 1000)"

// cursorPage names what the cursor is and where the next one comes from.
func cursorPage(what string) pageUsage {
	return pageUsage{after: "page cursor: start after this " + what + " (the \"more:\" hint of the previous page)", limit: limitUsage}
}

// pageFlags adds --limit and --after to c; the returned function puts
// them into a query.
func pageFlags(c *cobra.Command, u pageUsage) func(q map[string]string) map[string]string {
	var after string
	var limit int
	c.Flags().StringVar(&after, "after", "", u.after)
	c.Flags().IntVar(&limit, "limit", 0, u.limit)
	return func(q map[string]string) map[string]string {
		if q == nil {
			q = map[string]string{}
		}
		q["after"] = after
		if limit > 0 {
			q["limit"] = strconv.Itoa(limit)
		}
		return q
	}
}

// listPage GETs one page of path with the query q and prints it with
// table, then how to get the next page.
func listPage[T any](a *app, cmd *cobra.Command, path string, q map[string]string, table func(w *tabwriter.Writer, l proto.List[T])) error {
	r, err := a.call(cmd, http.MethodGet, path, q, nil, nil)
	if err != nil {
		return err
	}
	return show(a, r, func(w *tabwriter.Writer, l proto.List[T]) {
		table(w, l)
		nextHint(a, l.Next)
	})
}

// listTable prints a page as header, then one row per item.
func listTable[T any](header func(w *tabwriter.Writer), item func(w *tabwriter.Writer, v T)) func(w *tabwriter.Writer, l proto.List[T]) {
	return func(w *tabwriter.Writer, l proto.List[T]) {
		header(w)
		for _, v := range l.Items {
			item(w, v)
		}
	}
}

// filter is a string flag of a list command, passed as the query
// parameter of its name.
type filter struct{ name, usage string }

// listCmd is a command listing one page of path with the filters given,
// --limit and --after (their usage u).
func listCmd[T any](a *app, use, short, path string, u pageUsage, filters []filter, table func(w *tabwriter.Writer, l proto.List[T])) *cobra.Command {
	vals := make([]string, len(filters))
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := map[string]string{}
			for i, f := range filters {
				q[f.name] = vals[i]
			}
			return listPage(a, cmd, path, page(q), table)
		},
	}
	page = pageFlags(c, u)
	for i, f := range filters {
		c.Flags().StringVar(&vals[i], f.name, "", f.usage)
	}
	return c
}

// pagedIDCmd is a command listing one page of what belongs to one ID
// (GET prefix+ID+suffix), with --limit and --after.
func pagedIDCmd[T any](a *app, use, short, prefix, suffix string, u pageUsage, table func(w *tabwriter.Writer, l proto.List[T])) *cobra.Command {
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   use + " ID",
		Short: short,
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return listPage(a, cmd, prefix+pathEscape(args[0])+suffix, page(nil), table)
		},
	}
	page = pageFlags(c, u)
	return c
}

// idCmd is a command taking one ID: it calls method on prefix+ID+suffix
// with no body and renders the answer, a T, with table.
func idCmd[T any](a *app, use, short, method, prefix, suffix string, table func(w *tabwriter.Writer, v T)) *cobra.Command {
	return &cobra.Command{
		Use:   use + " ID",
		Short: short,
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, method, prefix+pathEscape(args[0])+suffix, nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, table)
		},
	}
}
