package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
)

// TmpFS mounts a tmpfs of size MiB on a new temporary directory and returns it; the test's
// cleanup unmounts it. A test fills it to see how a server behaves on "no space left on
// device". Mounting needs root (and CAP_SYS_ADMIN in a container): without them the test is
// skipped, also in strict mode, since nothing `make test` installs would help.
func TmpFS(t testing.TB, sizeMiB int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("testenv: mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(sizeMiB)+"m", "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("testenv: mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("testenv: umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// Fill writes a file of zeros at path until its filesystem has no more than leaveKiB KiB free
// (or it is full), and returns the path; removing the file frees the space again.
func Fill(t testing.TB, path string, leaveKiB int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 64<<10)
	for {
		free, err := freeKiB(path)
		if err != nil {
			t.Fatal(err)
		}
		if free <= leaveKiB {
			return path
		}
		n := min(int64(len(block)), (free-leaveKiB)<<10)
		if _, err := f.Write(block[:n]); err != nil {
			return path // full
		}
	}
}

// freeKiB is the space left, in KiB, on the filesystem of path.
func freeKiB(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize / 1024, nil
}
