package disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileDisk makes a sparse 3 GiB file disk carrying an ext4 superblock and
// data at its head, in its middle and at its tail.
func fileDisk(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvme0n1.img")
	f, err := os.Create(p)
	require.NoError(t, err)
	defer f.Close()
	const size = 3 << 30
	require.NoError(t, f.Truncate(size))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i%251 + 1)
	}
	copy(data[1024+0x38:], "\x53\xef")
	for _, off := range []int64{0, size / 2, size - 1<<20} {
		_, err := f.WriteAt(data, off)
		require.NoError(t, err)
	}
	return p
}

func TestFileDiskWipeAndVerify(t *testing.T) {
	for _, policy := range []Policy{PolicyDiscard, PolicyNVMeFormat, PolicyZero} {
		t.Run(string(policy), func(t *testing.T) {
			p := fileDisk(t)
			sigs, err := FileSignatures(p)
			require.NoError(t, err)
			assert.Contains(t, sigs, Signature{Type: "ext4", Offset: 1024 + 0x38})

			_, err = VerifyFile(context.Background(), p, VerifyOptions{Seed: 7})
			var ve *VerifyError
			require.True(t, errors.As(err, &ve), "a disk with data fails verification: %v", err)
			kinds := map[string]bool{}
			for _, f := range ve.Findings {
				kinds[f.Kind] = true
			}
			assert.True(t, kinds["head"] && kinds["tail"], "head and tail carry data: %+v", ve.Findings)
			assert.Equal(t, "ext4", ve.Findings[0].Signature)

			var progress []Progress
			proof, err := WipeFile(context.Background(), p, policy, WipeOptions{Progress: func(pr Progress) { progress = append(progress, pr) },
				Verify: VerifyOptions{Seed: 7}})
			require.NoError(t, err)
			assert.Equal(t, policy, proof.Method)
			assert.Equal(t, int64(3<<30), proof.Bytes)
			assert.Equal(t, "nvme0n1.img", proof.Device)
			assert.Len(t, proof.SampleDigest, 64)
			assert.NotEmpty(t, proof.Samples)
			assert.False(t, proof.VerifiedAt.IsZero())
			require.NotEmpty(t, progress)
			st, err := os.Stat(p)
			require.NoError(t, err)
			assert.Equal(t, int64(3<<30), st.Size(), "the wipe keeps the disk's size")
			sigs, err = FileSignatures(p)
			require.NoError(t, err)
			assert.Empty(t, sigs)

			again, err := VerifyFile(context.Background(), p, VerifyOptions{Seed: 7})
			require.NoError(t, err)
			assert.Equal(t, proof.SampleDigest, again.SampleDigest, "same seed, same samples, same zeros")
		})
	}
}

func TestFileDiskRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	p := fileDisk(t)
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(p, link))
	_, err := WipeFile(context.Background(), link, PolicyDiscard, WipeOptions{})
	require.Error(t, err, "a symlink is never followed")
	_, err = VerifyFile(context.Background(), dir, VerifyOptions{})
	require.ErrorContains(t, err, "not a regular file")
	_, err = WipeFile(context.Background(), p, Policy("shred"), WipeOptions{})
	require.ErrorContains(t, err, "shred")
}
