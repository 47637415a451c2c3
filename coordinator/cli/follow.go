package cli

// Live views of the slice runtime (proto/slice.go): `alloc create --wait`
// follows an allocation through its stages, `alloc timeline` shows the
// stages with their durations, `slot cleanup --wait` follows a cleanup.
//
// Following uses blocking queries: the allocation's task list answers
// ?index=N&wait=D as soon as a task or the allocation changes (every
// stage event and every byte-progress report rewrites the task), then the
// timeline and the allocation are read at once. The rendering is pure
// (stageView, progressLine, timelineRows): fed with timeline events and
// task rows, it returns the text, so golden tests pin it down.

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gpuaas/gpuaas/proto"
)

// stageView turns timeline events, as they arrive, into one line per
// finished stage: the stage, its outcome and its duration (the event
// minus the stage's started event), and its message.
type stageView struct {
	seen    uint64               // highest Seq rendered
	started map[string]time.Time // stage → its latest started event
	first   time.Time            // the first event (placement)
}

func newStageView() *stageView { return &stageView{started: map[string]time.Time{}} }

// Add renders the events not seen before (in Seq order) and returns
// their lines.
func (v *stageView) Add(evs []proto.TimelineEvent) []string {
	var out []string
	for _, e := range evs {
		if e.Seq <= v.seen {
			continue
		}
		v.seen = e.Seq
		if v.first.IsZero() {
			v.first = e.At
		}
		if e.Status == "started" {
			v.started[e.Stage] = e.At
			continue
		}
		dur := "-"
		if s, ok := v.started[opener(v.started, e.Stage)]; ok {
			dur = fmtDuration(e.At.Sub(s))
			delete(v.started, opener(v.started, e.Stage))
		}
		out = append(out, strings.TrimRight(fmt.Sprintf("%-13s %-9s %8s  %s", e.Stage, e.Status, dur, e.Message), " "))
	}
	return out
}

// Open reports whether stage has started and not ended yet.
func (v *stageView) Open(stage string) bool {
	_, ok := v.started[stage]
	return ok
}

// Elapsed is the time from the first event seen to at.
func (v *stageView) Elapsed(at time.Time) time.Duration {
	if v.first.IsZero() {
		return 0
	}
	return at.Sub(v.first)
}

// opener is the started stage an event of stage ends: its own, or, for
// the allocation's active/failed transition, provisioning.
func opener(started map[string]time.Time, stage string) string {
	if _, ok := started[stage]; !ok && (stage == string(proto.AllocActive) || stage == string(proto.AllocFailed)) {
		return string(proto.AllocProvisioning)
	}
	return stage
}

// fmtDuration prints a stage duration: milliseconds under a second,
// tenths of seconds under a minute, else minutes and seconds.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
}

// fmtBytes prints a byte count in binary units.
func fmtBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// progressLine is the plain (non-terminal) progress of a stage: bytes
// done of total, percent, rate and ETA (rate in bytes per second; 0 when
// not known yet).
func progressLine(stage string, done, total int64, rate float64) string {
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	s := fmt.Sprintf("%-13s %s / %s (%3.0f%%)", stage, fmtBytes(float64(done)), fmtBytes(float64(total)), pct)
	if rate > 0 {
		eta := time.Duration(math.Round(float64(total-done) / rate * float64(time.Second)))
		s += fmt.Sprintf("  %s/s  ETA %s", fmtBytes(rate), fmtDuration(eta))
	}
	return s
}

// timelineRows are the rows of `alloc timeline`: every event with the
// duration of the stage it ends.
func timelineRows(evs []proto.TimelineEvent) [][]string {
	started := map[string]time.Time{}
	rows := make([][]string, 0, len(evs))
	for _, e := range evs {
		dur := ""
		switch e.Status {
		case "started":
			started[e.Stage] = e.At
		default:
			if s, ok := started[opener(started, e.Stage)]; ok {
				dur = fmtDuration(e.At.Sub(s))
				delete(started, opener(started, e.Stage))
			}
		}
		rows = append(rows, []string{fmt.Sprint(e.Seq), ts(e.At), e.Stage, e.Status, dur, e.Message})
	}
	return rows
}

// failedStage is the stage a failed allocation failed in: the last
// failed event before the allocation's own.
func failedStage(evs []proto.TimelineEvent) string {
	for i := len(evs) - 1; i >= 0; i-- {
		if e := evs[i]; e.Status == "failed" && e.Stage != string(proto.AllocFailed) {
			return e.Stage
		}
	}
	return ""
}

// releaseOutcome renders the end of a followed release.
func releaseOutcome(a proto.Allocation, elapsed time.Duration) string {
	return fmt.Sprintf("allocation %s is released after %s", a.ID, fmtDuration(elapsed))
}

// outcome renders the end of a followed allocation: the SSH command of
// an active slice, or the stage and reason of a failure (as an error).
func outcome(a proto.Allocation, evs []proto.TimelineEvent, elapsed time.Duration) (string, error) {
	switch a.State {
	case proto.AllocActive:
		s := fmt.Sprintf("allocation %s is active after %s", a.ID, fmtDuration(elapsed))
		if a.Access != nil {
			// The command alloc ssh --print gives (a jump host that is
			// this machine dropped).
			s += "\nssh: " + sshCommand(a.Access)
			if note := noKeyNote(a); note != "" {
				s += "\n     " + note
			}
		}
		return s, nil
	case proto.AllocFailed:
		stage := failedStage(evs)
		if stage == "" {
			stage = "unknown"
		}
		return "", fmt.Errorf("allocation %s failed at stage %s: %s", a.ID, stage, a.Reason)
	default:
		return "", fmt.Errorf("allocation %s is %s: %s", a.ID, a.State, a.Reason)
	}
}

// bar is the byte progress of the running stage: a progress bar with
// rate and ETA on a terminal, else a plain line per change.
type bar struct {
	out   io.Writer
	tty   bool
	stage string
	pb    *progressbar.ProgressBar
	// plain mode: the last observation, for the rate.
	lastDone int64
	lastAt   time.Time
	rate     float64
	printed  string
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Update shows task progress observed at at. label names a task without
// a stage; open is false once the timeline says the stage ended. A task
// without byte progress, or a stage that ended, ends the current bar.
func (b *bar) Update(t *proto.Task, label string, open bool, at time.Time) {
	if t == nil || t.Total <= 0 || t.State != proto.TaskRunning || !open {
		b.End()
		return
	}
	stage := t.Stage
	if stage == "" {
		stage = label
	}
	if stage != b.stage {
		b.End()
		b.stage, b.lastDone, b.lastAt, b.rate = stage, t.Done, at, 0
		if b.tty {
			b.pb = progressbar.NewOptions64(t.Total, progressbar.OptionSetWriter(b.out), progressbar.OptionShowBytes(true),
				progressbar.OptionSetDescription(fmt.Sprintf("%-13s", stage)), progressbar.OptionSetPredictTime(true),
				progressbar.OptionShowElapsedTimeOnFinish(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond))
		}
	}
	if b.pb != nil {
		_ = b.pb.Set64(t.Done)
		return
	}
	if dt := at.Sub(b.lastAt).Seconds(); dt > 0 && t.Done > b.lastDone {
		b.rate = float64(t.Done-b.lastDone) / dt
		b.lastDone, b.lastAt = t.Done, at
	}
	if l := progressLine(stage, t.Done, t.Total, b.rate); l != b.printed {
		fmt.Fprintln(b.out, l)
		b.printed = l
	}
}

// End finishes the current bar, if any.
func (b *bar) End() {
	if b.pb != nil {
		_ = b.pb.Finish()
		fmt.Fprintln(b.out)
		b.pb = nil
	}
	b.stage, b.printed = "", ""
}

// follower renders one followed allocation.
type follower struct {
	out  io.Writer
	view *stageView
	bar  *bar
}

func newFollower(out io.Writer, tty bool) *follower {
	return &follower{out: out, view: newStageView(), bar: &bar{out: out, tty: tty}}
}

// Observe renders one observation made at at: the timeline's new stage
// lines (ending any progress bar first), then the running stage's byte
// progress of the provision task.
func (f *follower) Observe(evs []proto.TimelineEvent, prov *proto.Task, at time.Time) {
	if lines := f.view.Add(evs); len(lines) > 0 {
		f.bar.End()
		fmt.Fprintln(f.out, strings.Join(lines, "\n"))
	}
	if prov != nil {
		f.bar.Update(prov, "", f.view.Open(prov.Stage), at)
	}
}

// blockWait is the ?wait= of a blocking query: well inside the per-call
// timeout.
func (a *app) blockWait() string {
	w := min(20*time.Second, a.timeout/2)
	if w < time.Second {
		w = time.Second
	}
	return w.String()
}

// watch is the loop of every live view: it reads path (with the
// parameters q) until step says done or fails. The first read is
// consistent (it sees what was just written through the leader); each
// later one (once an answer had an index) blocks until the answer's
// index (index) moves past the last one or wait runs out (wait "":
// blockWait). step gets each answer decoded and the round (0 first); it
// owns the view's deadline.
func watch[T any](a *app, cmd *cobra.Command, path string, q map[string]string, wait string, index func(T) uint64,
	step func(r *Response, v T, round int) (done bool, err error)) error {
	if wait == "" {
		wait = a.blockWait()
	}
	var last uint64
	for round := 0; ; round++ {
		pq := maps.Clone(q)
		if pq == nil {
			pq = map[string]string{}
		}
		if last > 0 {
			pq["index"], pq["wait"] = strconv.FormatUint(last, 10), wait
		} else {
			pq["consistent"] = "true"
		}
		r, err := a.call(cmd, http.MethodGet, path, pq, nil, nil)
		if err != nil {
			return err
		}
		v, err := decode[T](r)
		if err != nil {
			return err
		}
		last = index(v)
		if done, err := step(r, v, round); done || err != nil {
			return err
		}
	}
}

// listIndex is the index of a list answer.
func listIndex[T any](l proto.List[T]) uint64 { return l.Index }

// followAllocation prints an allocation's stages as they happen, the
// running stage's byte progress, and the outcome: the SSH command of an
// active slice, or (as the error) the stage and reason of a failure. It
// gives up after limit.
func (a *app) followAllocation(cmd *cobra.Command, id string, limit time.Duration) error {
	return a.follow(cmd, id, limit, false)
}

// followRelease prints a release's stages as they happen (from the
// latest "release started" event) until the allocation is released.
func (a *app) followRelease(cmd *cobra.Command, id string, limit time.Duration) error {
	return a.follow(cmd, id, limit, true)
}

// releaseStart is the Seq before the latest release started event (0:
// none yet): a followed release shows its own stages only.
func releaseStart(evs []proto.TimelineEvent) uint64 {
	var seq uint64
	for _, e := range evs {
		if e.Stage == "release" && e.Status == "started" {
			seq = e.Seq - 1
		}
	}
	return seq
}

func (a *app) follow(cmd *cobra.Command, id string, limit time.Duration, release bool) error {
	out := a.out
	if a.output == "json" {
		out = io.Discard
	}
	f := newFollower(out, isTerminal(out))
	b := f.bar
	defer b.End()
	deadline := time.Now().Add(limit)
	base := "/v1/allocations/" + pathEscape(id)
	var index uint64
	stalled := 0
	return watch(a, cmd, base+"/tasks", map[string]string{"limit": "1000"}, "", listIndex[proto.Task],
		func(_ *Response, tasks proto.List[proto.Task], round int) (bool, error) {
			moved := tasks.Index != index
			index = tasks.Index
			var tq map[string]string
			if round == 0 {
				// The allocation was just written through the leader; the
				// replica this talks to may not have applied it yet.
				tq = map[string]string{"consistent": "true"}
			}
			// The allocation before its timeline: the timeline read then
			// holds every event up to the state read, so a final state is
			// rendered with the stages that led to it (read the other way
			// round, a failure landing between the two reads was reported
			// at stage "unknown" with the failed stage's lines missing).
			r, err := a.call(cmd, http.MethodGet, base, tq, nil, nil)
			if err != nil {
				return false, err
			}
			al, err := decode[proto.Allocation](r)
			if err != nil {
				return false, err
			}
			tl, err := a.wholeTimeline(cmd, base, tq)
			if err != nil {
				return false, err
			}
			var prov *proto.Task
			for i := range tasks.Items {
				t := &tasks.Items[i]
				switch {
				case !release && (t.Type == proto.TaskSliceProvision || t.Type == proto.TaskBaremetalHandoff):
					prov = t
				case release && (t.Type == proto.TaskSliceRelease || t.Type == proto.TaskBaremetalRelease):
					prov = t
				}
			}
			if release && f.view.seen == 0 {
				f.view.seen = releaseStart(tl.Items)
			}
			f.Observe(tl.Items, prov, time.Now())
			final := al.State == proto.AllocReleased
			if !release {
				switch al.State {
				case proto.AllocActive, proto.AllocFailed, proto.AllocReleased, proto.AllocReleasing:
					final = true
				}
			}
			if final {
				b.End()
				msg, err := outcome(al, tl.Items, f.view.Elapsed(time.Now().UTC()))
				if release {
					msg, err = releaseOutcome(al, f.view.Elapsed(time.Now().UTC())), nil
				}
				if a.output == "json" {
					if jerr := show(a, &Response{Body: r.Body}, allocDetail); jerr != nil {
						return true, jerr
					}
				} else if msg != "" {
					fmt.Fprintln(a.out, msg)
				}
				return true, err
			}
			if prov != nil && prov.State != proto.TaskQueued && prov.State != proto.TaskRunning {
				// The task is over; its follow-up lands right after it. An
				// allocation still not final a round later will not move.
				if stalled++; stalled > 1 && !moved || stalled > 3 {
					b.End()
					return true, fmt.Errorf("task %s is %s but allocation %s is still %s (the agent reported no slice result)", prov.ID, prov.State, al.ID, al.State)
				}
			}
			if release && al.State != proto.AllocReleasing && al.State != proto.AllocReleased {
				return true, fmt.Errorf("allocation %s is %s, not releasing: nothing to follow", al.ID, al.State)
			}
			if time.Now().After(deadline) {
				b.End()
				return true, fmt.Errorf("gave up after %s: allocation %s is %s", limit, al.ID, al.State)
			}
			return false, nil
		})
}

// wholeTimeline reads every page of an allocation's timeline (base is
// the allocation's path; q more query parameters).
func (a *app) wholeTimeline(cmd *cobra.Command, base string, q map[string]string) (proto.List[proto.TimelineEvent], error) {
	var all proto.List[proto.TimelineEvent]
	after := ""
	for {
		pq := map[string]string{"limit": strconv.Itoa(proto.MaxPageLimit), "after": after}
		for k, v := range q {
			pq[k] = v
		}
		r, err := a.call(cmd, http.MethodGet, base+"/timeline", pq, nil, nil)
		if err != nil {
			return all, err
		}
		l, err := decode[proto.List[proto.TimelineEvent]](r)
		if err != nil {
			return all, err
		}
		all.Items, all.Index = append(all.Items, l.Items...), l.Index
		if l.Next == "" || l.Next == after {
			return all, nil
		}
		after = l.Next
	}
}

// followTask waits until a node task is final, showing its byte
// progress (labelled label when it reports no stage), and returns it.
func (a *app) followTask(cmd *cobra.Command, t proto.Task, label string, limit time.Duration) (proto.Task, error) {
	b := &bar{out: a.out, tty: isTerminal(a.out)}
	defer b.End()
	deadline := time.Now().Add(limit)
	err := watch(a, cmd, "/v1/nodes/"+pathEscape(t.NodeID)+"/tasks", map[string]string{"limit": "1000"}, "", listIndex[proto.Task],
		func(_ *Response, l proto.List[proto.Task], _ int) (bool, error) {
			found := false
			for _, x := range l.Items {
				if x.ID == t.ID {
					t, found = x, true
				}
			}
			if !found {
				return true, fmt.Errorf("task %s is no longer listed for node %s", t.ID, t.NodeID)
			}
			if t.State != proto.TaskQueued && t.State != proto.TaskRunning {
				return true, nil
			}
			b.Update(&t, label, true, time.Now())
			if time.Now().After(deadline) {
				return true, fmt.Errorf("gave up after %s: task %s is %s", limit, t.ID, t.State)
			}
			return false, nil
		})
	return t, err
}

// settledSlot returns the slot once it has left cleanup_blocked: the
// proof is recorded right after the task's final report, so a reader may
// see the task done a moment before the slot moves. It blocks on the
// node's slots (a few rounds at most) and returns the last answer.
func (a *app) settledSlot(cmd *cobra.Command, node, id string) (*Response, error) {
	var out *Response
	err := watch(a, cmd, "/v1/slots", map[string]string{"node": node, "limit": "1000"}, "5s", listIndex[proto.Slot],
		func(_ *Response, l proto.List[proto.Slot], round int) (bool, error) {
			for _, s := range l.Items {
				if s.ID == id && (s.Status != proto.SlotCleanupBlocked || round >= 3) {
					var err error
					out, err = a.call(cmd, http.MethodGet, "/v1/slots/"+pathEscape(id), nil, nil, nil)
					return true, err
				}
			}
			if round >= 3 {
				return true, fmt.Errorf("slot %s is not listed for node %s", id, node)
			}
			return false, nil
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}
