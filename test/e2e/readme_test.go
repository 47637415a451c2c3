package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The README's command blocks are tests: every fenced block of README.md
// preceded by a `<!-- readme-test: NAME -->` line is run, line by line,
// the way a user types it, in a fresh folder where `bin/` holds what
// `make build` built and `bin/gpuaas-lab` runs as `make lab` runs it. The
// README and the test cannot drift: the test reads the README.

// readmeBlock is one marked block: its commands, continuation lines
// joined.
type readmeBlock struct {
	name  string
	lines []string
}

var readmeMarker = regexp.MustCompile(`^<!--\s*readme-test:\s*([a-z0-9-]+)\s*-->$`)

// readmeBlocks parses the marked blocks of a Markdown file, in order.
func readmeBlocks(md []byte) ([]readmeBlock, error) {
	var blocks []readmeBlock
	sc := bufio.NewScanner(bytes.NewReader(md))
	var cur *readmeBlock
	pending, in, cont := "", false, ""
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && readmeMarker.MatchString(trimmed):
			pending = readmeMarker.FindStringSubmatch(trimmed)[1]
		case !in && strings.HasPrefix(trimmed, "```"):
			in = true
			if pending != "" {
				blocks = append(blocks, readmeBlock{name: pending})
				cur = &blocks[len(blocks)-1]
				pending = ""
			}
		case in && strings.HasPrefix(trimmed, "```"):
			if cont != "" {
				return nil, fmt.Errorf("line %d: block %q ends inside a continued line", n, cur.name)
			}
			in, cur = false, nil
		case in && cur != nil:
			if strings.HasSuffix(line, `\`) {
				cont += strings.TrimSuffix(line, `\`)
				continue
			}
			full := strings.TrimSpace(cont + line)
			cont = ""
			if full != "" {
				cur.lines = append(cur.lines, full)
			}
		case !in && pending != "" && trimmed != "":
			return nil, fmt.Errorf("line %d: readme-test marker %q is not followed by a fenced block", n, pending)
		}
	}
	if in {
		return nil, fmt.Errorf("unterminated fenced block")
	}
	return blocks, sc.Err()
}

// stripComment drops a trailing shell comment (a # after whitespace,
// outside quotes).
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimSpace(line[:i])
		}
	}
	return strings.TrimSpace(line)
}

func TestReadmeBlocksParse(t *testing.T) {
	md := "x\n<!-- readme-test: one -->\n```\nsource .lab/env\nbin/a b \\\n    c   # comment\n\n```\n```\nnot marked\n```\n<!-- readme-test: two -->\n\n```sh\necho '#not a comment' # but this is\n```\n"
	blocks, err := readmeBlocks([]byte(md))
	require.NoError(t, err)
	require.Len(t, blocks, 2)
	require.Equal(t, "one", blocks[0].name)
	require.Equal(t, []string{"source .lab/env", "bin/a b     c   # comment"}, blocks[0].lines)
	require.Equal(t, "bin/a b     c", stripComment(blocks[0].lines[1]))
	require.Equal(t, "echo '#not a comment'", stripComment(blocks[1].lines[0]))

	_, err = readmeBlocks([]byte("<!-- readme-test: x -->\ntext\n"))
	require.ErrorContains(t, err, "not followed by a fenced block")
	_, err = readmeBlocks([]byte("```\nopen\n"))
	require.ErrorContains(t, err, "unterminated")

	// The real README has the blocks this test runs.
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	blocks, err = readmeBlocks(b)
	require.NoError(t, err)
	var names []string
	for _, bl := range blocks {
		names = append(names, bl.name)
		require.NotEmpty(t, bl.lines, bl.name)
	}
	for _, want := range readmeFlows {
		require.Contains(t, names, want.block, "README.md has no <!-- readme-test: %s --> block", want.block)
	}
}

// readmeShell runs README lines as a user's shell would: in dir, after
// the files the block sourced so far, with placeholders (ID, SLOT,
// DIAG, ...) replaced by what earlier commands produced.
type readmeShell struct {
	dir     string
	sourced []string
	vars    map[string]string
	log     *bytes.Buffer
}

var placeholder = regexp.MustCompile(`\b(ID|SLOT|DIAG|PID)\b`)

func (s *readmeShell) expand(t *testing.T, line string) string {
	t.Helper()
	return placeholder.ReplaceAllStringFunc(line, func(p string) string {
		v, ok := s.vars[p]
		require.True(t, ok, "README line %q uses %s before any command produced one", line, p)
		return v
	})
}

// run runs one README line; it returns the combined output and the
// error of a non-zero exit.
func (s *readmeShell) run(t *testing.T, raw string, timeout time.Duration, extra string) (string, error) {
	t.Helper()
	line := stripComment(raw)
	if line == "" {
		return "", nil
	}
	if f, ok := strings.CutPrefix(line, "source "); ok {
		s.sourced = append(s.sourced, f)
		return "", nil
	}
	cmdline := s.expand(t, line) + extra
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, f := range s.sourced {
		fmt.Fprintf(&script, "source %s\n", f)
	}
	script.WriteString(cmdline + "\n")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = s.dir
	cmd.Stdin = nil
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	fmt.Fprintf(s.log, "$ %s   (%.1fs, %v)\n%s\n", cmdline, time.Since(start).Seconds(), err, out.String())
	t.Logf("$ %s (%.1fs): %v", cmdline, time.Since(start).Seconds(), err)
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("%q did not finish within %s: %w", cmdline, timeout, ctx.Err())
	}
	return out.String(), err
}

// readmeStep is what the test expects of the README lines that match
// pattern (the first matching step applies).
type readmeStep struct {
	pattern *regexp.Regexp
	timeout time.Duration
	// extra is appended to the line: what makes an interactive command
	// (ssh) run one command and return.
	extra string
	// check looks at the output and may capture placeholders.
	check func(t *testing.T, s *readmeShell, out string)
}

type readmeFlow struct {
	block string
	steps []readmeStep
	// after checks the block's outcome with the CLI.
	after func(t *testing.T, s *readmeShell)
}

var (
	allocIDRe = regexp.MustCompile(`(?m)(?:^ID:\s+|allocation )(alloc-[0-9a-f]+)`)
)

func captureAlloc(t *testing.T, s *readmeShell, out string) {
	t.Helper()
	m := allocIDRe.FindStringSubmatch(out)
	require.NotNil(t, m, "no allocation ID in:\n%s", out)
	s.vars["ID"] = m[1]
}

func expect(re string) func(t *testing.T, s *readmeShell, out string) {
	rx := regexp.MustCompile(re)
	return func(t *testing.T, _ *readmeShell, out string) {
		t.Helper()
		require.Regexp(t, rx, out)
	}
}

func step(pattern string, timeout time.Duration, check func(t *testing.T, s *readmeShell, out string)) readmeStep {
	return readmeStep{pattern: regexp.MustCompile(pattern), timeout: timeout, check: check}
}

// readmeFlows are the README blocks the test runs, in README order.
var readmeFlows = []readmeFlow{
	{block: "first-commands", steps: []readmeStep{
		step(`node list`, time.Minute, expect(`(?s)j22u11 .*j22u15 .*j27u15 `)),
		step(`alloc create .*--wait`, 5*time.Minute, func(t *testing.T, s *readmeShell, out string) {
			captureAlloc(t, s, out)
			require.Regexp(t, `placed on node j22u15`, out, "the real slice host takes it")
			require.Regexp(t, `is active after`, out)
		}),
		step(`alloc tasks`, time.Minute, expect(`slice\.provision`)),
		step(`alloc release`, 2*time.Minute, nil),
		step(`/readyz`, time.Minute, expect(`ready`)),
		step(`openapi`, time.Minute, expect(`openapi: `)),
		step(`gpuaas-lab status`, time.Minute, expect(`j22u15`)),
	}, after: func(t *testing.T, s *readmeShell) {
		requireReleased(t, s, "j22u15")
	}},
	{block: "real-slice", steps: []readmeStep{
		step(`alloc create .*--wait`, 5*time.Minute, func(t *testing.T, s *readmeShell, out string) {
			captureAlloc(t, s, out)
			require.Contains(t, out, "ssh_ready")
			require.Regexp(t, `placed on node j22u15`, out)
		}),
		// Interactive: the test adds a remote command. The guest's host
		// key is pinned by alloc ssh, so BatchMode (no prompt) must pass.
		{pattern: regexp.MustCompile(`^bin/gpuaasctl alloc ssh `), timeout: time.Minute,
			extra: " -- -o BatchMode=yes cat /proc/version",
			check: expect(`Linux version`)},
		step(`alloc timeline`, time.Minute, expect(`clone[\s\S]*ssh_ready`)),
		step(`alloc release`, 2*time.Minute, nil),
	}, after: func(t *testing.T, s *readmeShell) {
		requireReleased(t, s, "j22u15")
	}},
	{block: "simulated-slice", steps: []readmeStep{
		step(`prepare-slice`, 3*time.Minute, nil),
		step(`alloc create --gpus 2 .*--wait`, 3*time.Minute, func(t *testing.T, s *readmeShell, out string) {
			captureAlloc(t, s, out)
			require.Regexp(t, `placed on node j22u11`, out, "j22u15 is drained: the simulated host takes it")
			require.Regexp(t, `is active after`, out)
		}),
		step(`alloc release .*--wait`, 3*time.Minute, expect(`released`)),
		step(`alloc create --gpus 1 .*--wait`, 3*time.Minute, func(t *testing.T, s *readmeShell, out string) {
			captureAlloc(t, s, out)
			require.Regexp(t, `placed on node j22u11`, out)
		}),
		step(`slot list .*cleanup_blocked`, time.Minute, func(t *testing.T, s *readmeShell, out string) {
			m := regexp.MustCompile(`(?m)^(j22u11-s\d+)\s.*cleanup_blocked`).FindStringSubmatch(out)
			require.NotNil(t, m, "the force-released slice's slot is cleanup_blocked:\n%s", out)
			s.vars["SLOT"] = m[1]
		}),
		step(`slot cleanup .*--wait`, 3*time.Minute, nil),
		step(`audit list`, time.Minute, expect(`(?s)/v1/nodes/\{id\}/drain.*/v1/allocations/\{id\}/force-release.*demo.*/v1/slots/\{id\}/cleanup`)),
	}, after: func(t *testing.T, s *readmeShell) {
		requireReleased(t, s, "j22u11")
		out, err := s.run(t, "bin/gpuaasctl slot show "+s.vars["SLOT"]+" -o json", time.Minute, "")
		require.NoError(t, err, out)
		require.Contains(t, out, `"available"`, "slot cleanup made it available")
		require.Contains(t, out, `"wipe_proof"`)
	}},
	{block: "baremetal", steps: []readmeStep{
		step(`alloc create --shape baremetal`, 5*time.Minute, func(t *testing.T, s *readmeShell, out string) {
			captureAlloc(t, s, out)
			require.Regexp(t, `placed on node j27u15`, out)
			require.Contains(t, out, "maas.image_deploy")
			require.Regexp(t, `is active after`, out)
		}),
		step(`alloc timeline`, time.Minute, expect(`maas\.image_deploy`)),
		step(`alloc release .*--wait`, 5*time.Minute, expect(`(?s)maas\.release_erase.*released`)),
		step(`availability`, time.Minute, expect(`h200-sxm-baremetal`)),
	}},
}

// requireReleased waits until the allocation in ID is released, then
// checks that no slot of node is left releasing, cleanup_blocked or
// allocated, and the released ones carry a wipe proof.
func requireReleased(t *testing.T, s *readmeShell, node string) {
	t.Helper()
	require.Eventually(t, func() bool {
		out, err := s.run(t, "bin/gpuaasctl alloc show "+s.vars["ID"], time.Minute, "")
		return err == nil && regexp.MustCompile(`State:\s+released`).MatchString(out)
	}, 3*time.Minute, time.Second, "allocation %s released", s.vars["ID"])
	out, err := s.run(t, "bin/gpuaasctl slot list --node "+node+" -o json", time.Minute, "")
	require.NoError(t, err, out)
	for _, bad := range []string{`"reserved"`, `"allocated"`, `"releasing"`, `"cleanup_blocked"`} {
		require.NotContains(t, out, bad, "slots of %s", node)
	}
	require.Contains(t, out, `"wipe_proof"`)
}

// TestPrivilegedReadmeFlows builds the binaries with `make build`, starts
// `bin/gpuaas-lab` in a fresh folder as `make lab` does (real VMs on
// j22u15: a machine that cannot run them fails this test in the
// privileged tier), runs the README's marked blocks and checks what they
// did, then stops the lab with Ctrl-C and checks it stopped clean.
func TestPrivilegedReadmeFlows(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the whole lab with real VMs")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("GPUAAS_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal("the README flows need root (real VMs on the lab's slice host)")
		}
		t.Skip("the README flows need root (real VMs on the lab's slice host)")
	}
	md, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	blocks, err := readmeBlocks(md)
	require.NoError(t, err)
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)

	// make build, as make lab runs it: the binaries land in the source
	// tree's bin/. The user's folder is a fresh one whose bin/ is that
	// folder, so the README's relative paths (bin/..., .lab/...) work
	// and the developer's own .lab is left alone.
	build := exec.Command("make", "-C", repo, "--no-print-directory", "build")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make build:\n%s", out)
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	require.NoError(t, os.Symlink(filepath.Join(repo, "bin"), bin))

	// make lab: bin/gpuaas-lab with no flags, in the user's folder.
	var labOut bytes.Buffer
	lab := exec.Command(filepath.Join(bin, "gpuaas-lab"))
	lab.Dir = work
	lab.Stdout, lab.Stderr = &labOut, &labOut
	lab.Env = append(os.Environ(), "GPUAAS_LAB_DIR=") // the default folder, .lab
	require.NoError(t, lab.Start())
	exited := make(chan error, 1)
	go func() { exited <- lab.Wait() }()
	labDir := filepath.Join(work, ".lab")
	t.Cleanup(func() {
		if lab.ProcessState == nil {
			_ = lab.Process.Signal(syscall.SIGINT)
			select {
			case <-exited:
			case <-time.After(60 * time.Second):
				_ = lab.Process.Kill()
				<-exited
			}
		}
		killByArg(t, labDir)
		if st, err := readLabHostsDir(labDir); err == nil && st != "" {
			_ = os.RemoveAll(st)
		}
		if t.Failed() {
			t.Logf("lab output:\n%s", labOut.String())
		}
	})
	// The first start builds the guest images (~1-2 min) and starts
	// libvirtd; the README promises the lab is up within minutes.
	up := false
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if strings.Contains(labOut.String(), labReady) {
			up = true
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("gpuaas-lab exited before it was up (%v):\n%s", err, labOut.String())
		default:
		}
	}
	require.True(t, up, "gpuaas-lab was not up within 10 minutes:\n%s", labOut.String())
	summary := labOut.String()
	require.NotContains(t, summary, "real slice host unavailable", "make lab must run real VMs on this machine")
	require.Regexp(t, `j22u15 +slice_vm +active +slice-ready`, summary)

	s := &readmeShell{dir: work, vars: map[string]string{}, log: &bytes.Buffer{}}
	if d, err := readAgentDiag(labDir, "j22u15"); err == nil {
		s.vars["DIAG"] = d
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(os.TempDir(), "gpuaas-readme-flows.log"), s.log.Bytes(), 0o644)
	})
	byName := map[string]readmeBlock{}
	for _, b := range blocks {
		byName[b.name] = b
	}
	for _, f := range readmeFlows {
		b, ok := byName[f.block]
		require.True(t, ok, "README.md has no block %q", f.block)
		s.sourced = nil
		for _, line := range b.lines {
			var st *readmeStep
			for i := range f.steps {
				if f.steps[i].pattern.MatchString(stripComment(line)) {
					st = &f.steps[i]
					break
				}
			}
			timeout, extra := time.Minute, ""
			if st != nil {
				timeout, extra = st.timeout, st.extra
			}
			out, err := s.run(t, line, timeout, extra)
			require.NoError(t, err, "README block %s, line %q:\n%s", f.block, line, out)
			if st != nil && st.check != nil {
				st.check(t, s, out)
			}
		}
		if f.after != nil {
			f.after(t, s)
		}
	}

	// Ctrl-C: the lab stops its agents, coordinators and VMs.
	require.NoError(t, lab.Process.Signal(syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, "the lab exits cleanly on Ctrl-C")
		require.Contains(t, labOut.String(), "gpuaas-lab stopped: the lab in", "the last line says the lab is down")
	case <-time.After(90 * time.Second):
		t.Fatal("the lab did not stop within 90 s of Ctrl-C")
	}
	require.Empty(t, processesWith(labDir), "processes of the lab still running after it stopped")
}

// readLabHostsDir reads the host roots' folder from the lab's lab.json.
func readLabHostsDir(labDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(labDir, "lab.json"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`"hosts_dir":\s*"([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("no hosts_dir")
	}
	return string(m[1]), nil
}

// readAgentDiag reads a host's diagnostics address from lab.json.
func readAgentDiag(labDir, host string) (string, error) {
	b, err := os.ReadFile(filepath.Join(labDir, "lab.json"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`"name":\s*"` + host + `"[^}]*?"diag":\s*"([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("no diag address for %s", host)
	}
	return string(m[1]), nil
}

// processesWith lists the processes whose command line mentions arg.
func processesWith(arg string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(arg)) {
			continue
		}
		if filepath.Base(filepath.Dir(p)) == fmt.Sprint(os.Getpid()) {
			continue
		}
		found = append(found, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	return found
}
