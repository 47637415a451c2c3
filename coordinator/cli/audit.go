package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// auditCmd reads the coordinator's hash-chained audit log (admin):
// list with filters, export as JSON lines, verify the chain online or an
// export offline, and prune an exported prefix.
func (a *app) auditCmd() *cobra.Command {
	c := &cobra.Command{Use: "audit", Short: "The tamper-evident audit log: list, export, verify, prune (admin)"}
	c.AddCommand(a.auditListCmd(), a.auditExportCmd(), a.auditVerifyCmd(), a.auditPruneCmd(), a.auditAckCmd(), a.auditRetentionCmd())
	return c
}

func auditHeader(w *tabwriter.Writer) {
	row(w, "SEQ", "TIME", "ACTOR", "ROLE", "TOKEN", "REMOTE", "METHOD", "ROUTE", "OBJECT", "STATUS", "REASON/ERROR")
}

func auditRow(w *tabwriter.Writer, r proto.AuditRecord) {
	obj := r.ObjectKind
	if r.ObjectID != "" {
		obj += ":" + r.ObjectID
	}
	note := r.Reason
	if r.Error != "" {
		note = strings.TrimSpace(note + " " + r.Error)
	}
	row(w, r.Seq, ts(r.Time), r.Actor, r.Role, r.TokenID, r.Remote, r.Method, r.Route, obj, r.Status, note)
}

// auditTable prints one page of records.
var auditTable = listTable(auditHeader, auditRow)

// auditPage is the usage of the page flags of the audit lists.
var auditPage = pageUsage{after: "page cursor (a seq)", limit: "page size"}

// parseSince takes an RFC 3339 time or a duration back from now (24h).
func parseSince(flag, v string, now time.Time) (string, error) {
	if v == "" {
		return "", nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d).UTC().Format(time.RFC3339Nano), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return "", usagef("--%s %q: use an RFC 3339 time (2026-11-25T18:00:00Z) or a duration back from now (24h)", flag, v)
	}
	return t.UTC().Format(time.RFC3339Nano), nil
}

func (a *app) auditListCmd() *cobra.Command {
	var actor, object, kind, slot, since, until string
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   "list",
		Short: "List audit records (oldest first), filtered",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			s, err := parseSince("since", since, now)
			if err != nil {
				return err
			}
			u, err := parseSince("until", until, now)
			if err != nil {
				return err
			}
			q := map[string]string{"actor": actor, "object": object, "kind": kind, "slot": slot, "since": s, "until": u}
			return listPage(a, cmd, "/v1/audit", page(q), auditTable)
		},
	}
	page = pageFlags(c, auditPage)
	f := c.Flags()
	f.StringVar(&actor, "actor", "", "only this principal's requests")
	f.StringVar(&object, "object", "", "only requests on this object id")
	f.StringVar(&kind, "kind", "", "only this object kind (allocation, node, slot, region, pool, site, image, peer, ...)")
	f.StringVar(&slot, "slot", "", "only requests touching this slot")
	f.StringVar(&since, "since", "", "from this time (RFC 3339, or a duration back from now: 24h)")
	f.StringVar(&until, "until", "", "before this time (RFC 3339, or a duration back from now)")
	return c
}

func (a *app) auditExportCmd() *cobra.Command {
	var ack bool
	c := &cobra.Command{
		Use:   "export",
		Short: "Write the whole audit log as JSON lines to stdout (gpuaasctl audit export > audit.jsonl)",
		Long: "Writes the whole log (its prune checkpoint included) as JSON lines to stdout. With --ack the\n" +
			"export is verified as it is written and, when it verifies, its last record (seq and hash) is\n" +
			"acknowledged as exported: over -audit-max-records the leader may then prune up to there.\n" +
			"Keep the file somewhere else first; the acknowledgement is printed to stderr.",
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
			defer cancel()
			if !ack {
				return c.Stream(ctx, "/v1/audit/export", nil, a.out)
			}
			pr, pw := io.Pipe()
			type verified struct {
				res proto.AuditVerifyResult
				err error
			}
			done := make(chan verified, 1)
			go func() {
				res, _, err := VerifyExport(pr)
				_, _ = io.Copy(io.Discard, pr) // a broken chain stops reading: drain
				done <- verified{res, err}
			}()
			err = c.Stream(ctx, "/v1/audit/export", nil, io.MultiWriter(a.out, pw))
			pw.CloseWithError(err)
			v := <-done
			if err != nil {
				return err
			}
			if v.err != nil {
				return fmt.Errorf("verify the export: %w; nothing acknowledged", v.err)
			}
			if !v.res.OK {
				return fmt.Errorf("%w: the export is broken at record %d (%s); nothing acknowledged", errChainBroken, v.res.BrokenSeq, v.res.Problem)
			}
			return a.ackExport(cmd, v.res.LastSeq, v.res.HeadHash)
		},
	}
	c.Flags().BoolVar(&ack, "ack", false, "acknowledge the export (its last record) once it verifies: exported records may then be pruned over the cap")
	return c
}

// ackExport acknowledges an export through record seq (hash) and prints
// the retention state to stderr (stdout may hold the export).
func (a *app) ackExport(cmd *cobra.Command, seq uint64, hash string) error {
	r, err := a.call(cmd, http.MethodPost, "/v1/audit/ack", nil, proto.AuditExportAckRequest{ThroughSeq: seq, Hash: hash}, nil)
	if err != nil {
		return err
	}
	var ret proto.AuditRetention
	if err := json.Unmarshal(r.Body, &ret); err != nil {
		return err
	}
	fmt.Fprintf(a.errOut, "acknowledged the export through record %d (%d records after it; cap %d, log holds %d)\n", seq, ret.Unexported, ret.MaxRecords, ret.Records)
	return nil
}

func (a *app) auditAckCmd() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "ack",
		Short: "Acknowledge an export written earlier (--file): its records may be pruned over the cap",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, _, err := verifiedExport(file, "the export (gpuaasctl audit export > audit.jsonl) to acknowledge", "acknowledged")
			if err != nil {
				return err
			}
			return a.ackExport(cmd, res.LastSeq, res.HeadHash)
		},
	}
	c.Flags().StringVar(&file, "file", "", "the export (JSON lines) to acknowledge")
	return c
}

func (a *app) auditRetentionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "retention",
		Short: "The audit log's size cap, export watermark and whether the cap holds",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/audit/retention", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, ret proto.AuditRetention) {
				row(w, "Records:", ret.Records)
				row(w, "Seqs:", fmt.Sprintf("%d..%d", ret.FirstSeq, ret.HeadSeq))
				row(w, "Cap (-audit-max-records):", ret.MaxRecords)
				if ret.Exported != nil {
					row(w, "Exported through:", fmt.Sprintf("%d (acknowledged by %s at %s)", ret.Exported.Seq, ret.Exported.By, ret.Exported.At.Format(time.RFC3339)))
				} else {
					row(w, "Exported through:", "none acknowledged")
				}
				row(w, "Unexported records:", ret.Unexported)
				if ret.Blocked {
					row(w, "WARNING:", ret.Warning)
				}
			})
		},
	}
}

// errChainBroken is the error of a verify that found the chain broken
// (exit 1 after the result is printed).
var errChainBroken = errors.New("the audit chain does not verify")

func (a *app) auditVerifyCmd() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "verify",
		Short: "Walk the audit log's hash chain on the coordinator, or of an export offline (--file)",
		Long: "Without --file the coordinator walks its own log. With --file (- for stdin) the export is\n" +
			"checked here, without the coordinator: every line must decode, seq must run without gaps from 1\n" +
			"(or from a prune checkpoint), and each record must link to and hash as its predecessor says.\n" +
			"Exit status 1 when the chain is broken; the first broken seq is printed.",
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res proto.AuditVerifyResult
			if file == "" {
				r, err := a.call(cmd, http.MethodGet, "/v1/audit/verify", nil, nil, nil)
				if err != nil {
					return err
				}
				if res, err = decode[proto.AuditVerifyResult](r); err != nil {
					return err
				}
			} else {
				var err error
				if res, _, err = verifyExportFile(file); err != nil {
					return err
				}
			}
			if err := printVerify(a, res); err != nil {
				return err
			}
			if !res.OK {
				return fmt.Errorf("%w: first broken record %d: %s", errChainBroken, res.BrokenSeq, res.Problem)
			}
			return nil
		},
	}
	c.Flags().StringVar(&file, "file", "", "verify this export (JSON lines; - for stdin) offline instead of asking the coordinator")
	return c
}

func printVerify(a *app, res proto.AuditVerifyResult) error {
	if a.output == "json" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(a.out, string(b))
		return err
	}
	w := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	row(w, "Chain intact:", yesNo(res.OK))
	row(w, "Records:", res.Records)
	row(w, "First seq:", res.FirstSeq)
	row(w, "Last seq:", res.LastSeq)
	row(w, "Head hash:", res.HeadHash)
	if !res.OK {
		row(w, "Broken at seq:", res.BrokenSeq)
		row(w, "Problem:", res.Problem)
	}
	return w.Flush()
}

// maxAuditLine bounds one line of an export (a record's before and
// after are at most 16 KiB each).
const maxAuditLine = 1 << 20

// verifyExportFile checks an export offline; it also returns the records
// by seq (for prune). A line that does not decode is a broken chain at
// the record after the last good one.
func verifyExportFile(path string) (proto.AuditVerifyResult, map[uint64]*proto.AuditRecord, error) {
	var r io.Reader
	if path == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return proto.AuditVerifyResult{}, nil, usagef("--file: %v", err)
		}
		defer f.Close()
		r = f
	}
	return VerifyExport(r)
}

// verifiedExport is the export in file (the required --file; need says
// what it is for) once it verifies: a broken chain is an error saying
// nothing was done (nothing ..., e.g. "acknowledged").
func verifiedExport(file, need, nothing string) (proto.AuditVerifyResult, map[uint64]*proto.AuditRecord, error) {
	if file == "" {
		return proto.AuditVerifyResult{}, nil, usagef("--file is required: %s", need)
	}
	res, recs, err := verifyExportFile(file)
	if err != nil {
		return res, nil, err
	}
	if !res.OK {
		return res, nil, fmt.Errorf("%w: the export %s is broken at record %d (%s); nothing %s", errChainBroken, file, res.BrokenSeq, res.Problem, nothing)
	}
	return res, recs, nil
}

// VerifyExport checks an audit export (JSON lines) offline.
func VerifyExport(r io.Reader) (proto.AuditVerifyResult, map[uint64]*proto.AuditRecord, error) {
	var v proto.AuditVerifier
	recs := map[uint64]*proto.AuditRecord{}
	br := bufio.NewReaderSize(r, 64<<10)
	var last uint64
	for n := 1; ; n++ {
		line, err := readLine(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			return proto.AuditVerifyResult{}, nil, fmt.Errorf("read export line %d: %w", n, err)
		}
		if strings.TrimSpace(string(line)) == "" {
			continue
		}
		rec, derr := proto.DecodeAuditLine(line)
		if derr != nil {
			res := v.Result()
			res.OK, res.BrokenSeq = false, last+1
			res.Problem = fmt.Sprintf("line %d: %v", n, derr)
			return res, recs, nil
		}
		last = rec.Seq
		recs[rec.Seq] = rec
		if !v.Add(rec) {
			break
		}
	}
	res := v.Result()
	if res.Records == 0 {
		res.OK, res.Problem = false, "the export holds no records"
	}
	return res, recs, nil
}

// readLine reads one line of at most maxAuditLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		part, isPrefix, err := br.ReadLine()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				return line, nil
			}
			return nil, err
		}
		line = append(line, part...)
		if len(line) > maxAuditLine {
			return nil, fmt.Errorf("line is over %d bytes", maxAuditLine)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

func (a *app) auditPruneCmd() *cobra.Command {
	var file string
	var through uint64
	c := &cobra.Command{
		Use:   "prune",
		Short: "Drop the records an export holds from the coordinator's log (export first)",
		Long: "Retention is explicit and export-first: the export (--file) is verified offline, then the\n" +
			"coordinator drops its records up to --through (default: the export's last record) after\n" +
			"checking that record's hash against the export. The record stays as a checkpoint the rest of\n" +
			"the chain verifies from; the prune itself is recorded right after it.",
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, recs, err := verifiedExport(file, "prune only what you exported (gpuaasctl audit export > audit.jsonl)", "pruned")
			if err != nil {
				return err
			}
			if through == 0 {
				through = res.LastSeq
			}
			rec, ok := recs[through]
			if !ok {
				return usagef("--through %d: the export holds records %d..%d", through, res.FirstSeq, res.LastSeq)
			}
			body := map[string]any{"through_seq": through, "hash": rec.Hash}
			r, err := a.call(cmd, http.MethodPost, "/v1/audit/prune", nil, body, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, p proto.AuditPruneResponse) {
				row(w, "Pruned records:", p.Pruned)
				row(w, "Log now starts at:", p.FirstSeq)
			})
		},
	}
	c.Flags().StringVar(&file, "file", "", "the export (JSON lines) whose records to prune")
	c.Flags().Uint64Var(&through, "through", 0, "prune up to and including this seq (default: the export's last)")
	return c
}

// slotHistoryCmd prints a slot's lifecycle trail: the audit records of
// requests that touched it (approve, disable, repair, cleanup, the
// allocations placed on it, its node's drain and intent).
func (a *app) slotHistoryCmd() *cobra.Command {
	var page func(map[string]string) map[string]string
	c := &cobra.Command{
		Use:   "history SLOT",
		Short: "The slot's lifecycle trail from the audit log (admin)",
		Args:  exactArgs("SLOT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return listPage(a, cmd, "/v1/audit", page(map[string]string{"slot": args[0]}), auditTable)
		},
	}
	page = pageFlags(c, auditPage)
	return c
}
