//go:build linux || darwin

package sqlite

import "syscall"

// freeBytes is the space of the file system holding dir that this user may still fill.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
