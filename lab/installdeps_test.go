package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// installDeps runs install-deps.sh with fake dpkg-query, apt-get, id and
// go first on PATH: FAKE_MISSING lists the packages dpkg-query reports
// absent, FAKE_APT_FAIL makes apt-get install fail.
func installDeps(t *testing.T, missing, fail string) (string, error) {
	t.Helper()
	bin := t.TempDir()
	fakes := map[string]string{
		"id": "#!/bin/sh\necho 0\n",
		"go": "#!/bin/sh\necho go version go1.26.8 linux/amd64\n",
		"dpkg-query": `#!/bin/sh
pkg=$(eval echo \${$#})
for m in $FAKE_MISSING; do [ "$m" = "$pkg" ] && exit 1; done
printf 'install ok installed'
`,
		"apt-get": `#!/bin/sh
echo "apt-get $*" >> "$FAKE_APT_LOG"
case " $* " in
*" update "*)
  echo "Hit:1 http://deb.debian.org/debian bookworm InRelease"
  echo "Get:2 http://deb.debian.org/debian bookworm-updates InRelease [55.4 kB]"
  echo "Reading package lists..."
  exit 0 ;;
esac
echo "verbose apt output that stays in the log"
echo "dlstatus:1:0.0:Retrieving file 1 of 2" >&3
echo "dlstatus:1:4.5:Retrieving file 1 of 2" >&3
echo "dlstatus:2:55.0:Retrieving file 2 of 2" >&3
if [ -n "$FAKE_APT_FAIL" ]; then
  echo "E: Unable to locate package ovmf"
  exit 100
fi
echo "pmstatus:ovmf:20.0:Unpacking ovmf (all)" >&3
echo "pmstatus:tini:40.0:Preparing to configure tini (amd64)" >&3
echo "pmstatus:tini:80.0:Installed tini (amd64)" >&3
exit 0
`,
	}
	for name, body := range fakes {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755))
	}
	cmd := exec.Command("bash", "install-deps.sh")
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "TMPDIR=" + t.TempDir(), "FAKE_MISSING=" + missing,
		"FAKE_APT_FAIL=" + fail, "FAKE_APT_LOG=" + filepath.Join(bin, "apt.log")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestInstallDepsIsQuietWhenNothingIsMissing(t *testing.T) {
	t.Parallel()
	out, err := installDeps(t, "", "")
	require.NoError(t, err, out)
	assert.Empty(t, out)
}

func TestInstallDepsShowsProgress(t *testing.T) {
	t.Parallel()
	out, err := installDeps(t, "ovmf tini", "")
	require.NoError(t, err, out)
	t.Logf("install-deps:\n%s", out)
	want := []string{
		"install-deps: installing 2 missing package(s)",
		"install-deps:   ovmf tini",
		"install-deps: apt-get update",
		"install-deps:   Hit:1 http://deb.debian.org/debian bookworm InRelease",
		"install-deps:   Get:2 http://deb.debian.org/debian bookworm-updates InRelease [55.4 kB]",
		"install-deps: apt-get install",
		"install-deps:   downloading 0% (Retrieving file 1 of 2)",
		"install-deps:   downloading 55% (Retrieving file 2 of 2)",
		"install-deps:   [20%] Unpacking ovmf (all)",
		"install-deps:   [80%] Installed tini (amd64)",
		"install-deps: installed 2 package(s)",
	}
	last := -1
	for _, w := range want {
		i := strings.Index(out, w)
		require.GreaterOrEqual(t, i, 0, "missing %q in:\n%s", w, out)
		assert.Greater(t, i, last, "%q out of order", w)
		last = i
	}
	assert.NotContains(t, out, "downloading 4%", "the download is reported every 10 %")
	assert.NotContains(t, out, "verbose apt output", "apt's own output goes to the log")
	assert.NotContains(t, out, "Reading package lists")
	assert.NotContains(t, out, "Preparing to configure", "two lines per package: unpacking and installed")
}

func TestInstallDepsFailureShowsTheLog(t *testing.T) {
	t.Parallel()
	out, err := installDeps(t, "ovmf", "yes")
	require.Error(t, err, out)
	assert.Contains(t, out, "install-deps: apt-get install failed; the last lines of ")
	assert.Contains(t, out, "E: Unable to locate package ovmf")
	assert.NotContains(t, out, "installed 1 package(s)")
}
