package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Read-your-writes across replicas. Every coordinator replica answers
// reads from its own ledger, which may lag the leader by a few
// milliseconds (or more, after a restart or a partition). So that a read
// never shows less than the invoker's own last write, whichever
// coordinator it reaches, gpuaasctl remembers the X-Gpuaas-Index of the
// last successful write and sends it as ?min_index= on later reads: a
// replica answers only once it has applied that index (or forwards the
// read to the leader). The index lives in a small file under the user's
// cache directory ($XDG_CACHE_HOME/gpuaas/indexes.json, else
// ~/.cache/gpuaas/...), keyed by a hash of the token: a Raft index only
// means something in the cluster it came from, and a lab's or an
// environment's token is what names that cluster for the CLI (its
// replicas have different addresses). A remembered index the cluster never
// reached (the cluster was re-created with the same token) is dropped:
// the replica's 503 "behind min_index" makes the CLI forget it and read
// again without. Within one command a create or release followed by
// --wait needs nothing of this: its first read is consistent.

const indexFileName = "indexes.json"

// maxRememberedIndexes bounds the file (least recently written dropped).
const maxRememberedIndexes = 64

type rememberedIndex struct {
	Index uint64    `json:"index"`
	At    time.Time `json:"at"`
}

// indexFile is where the last write indexes live, "" when the
// environment names no cache directory.
func (a *app) indexFile() string {
	dir := a.env("XDG_CACHE_HOME")
	if dir == "" {
		home := a.env("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".cache")
	}
	return filepath.Join(dir, "gpuaas", indexFileName)
}

// indexKey names a cluster by a hash of the token (never the token).
func indexKey(token string) string {
	sum := sha256.Sum256([]byte("gpuaas-index:" + token))
	return hex.EncodeToString(sum[:8])
}

func loadIndexes(path string) map[string]rememberedIndex {
	m := map[string]rememberedIndex{}
	b, err := os.ReadFile(path)
	if err != nil {
		return m
	}
	if json.Unmarshal(b, &m) != nil {
		return map[string]rememberedIndex{} // unreadable: start over
	}
	return m
}

// lastWriteIndex is the index of the last write remembered for token.
func (a *app) lastWriteIndex(token string) uint64 {
	path := a.indexFile()
	if path == "" {
		return 0
	}
	return loadIndexes(path)[indexKey(token)].Index
}

// rememberWrite records the index of a successful write for token (the
// largest wins); forget (idx 0) drops it. Failing to write the cache is
// not an error of the command.
func (a *app) rememberWrite(token string, idx uint64, forget bool) {
	path := a.indexFile()
	if path == "" {
		return
	}
	m := loadIndexes(path)
	k := indexKey(token)
	switch {
	case forget:
		delete(m, k)
	case idx > m[k].Index:
		m[k] = rememberedIndex{Index: idx, At: time.Now().UTC()}
	default:
		return
	}
	for len(m) > maxRememberedIndexes {
		oldest := ""
		for key, v := range m {
			if oldest == "" || v.At.Before(m[oldest].At) {
				oldest = key
			}
		}
		delete(m, oldest)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".indexes-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}

// writeIndex is the X-Gpuaas-Index of a successful write answer, 0 when
// it has none.
func writeIndex(method string, r *Response) uint64 {
	if method == http.MethodGet || method == http.MethodHead || r == nil {
		return 0
	}
	n, _ := strconv.ParseUint(r.Header.Get(proto.IndexHeader), 10, 64)
	return n
}

// behindMinIndex reports a 503 saying the cluster has not reached the
// ?min_index the CLI sent.
func behindMinIndex(err error) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Code == proto.CodeUnavailable && strings.Contains(pe.Detail, "behind min_index")
}
