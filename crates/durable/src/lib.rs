//! Files that survive a kill at any moment.
//!
//! A file replaced with [`write()`] or [`write_via_path`] holds either all of
//! its old content or all of the new whenever the process dies (kill -9, out
//! of memory, or a power cut after the call returned): the new content goes
//! to a temporary file in the target's own directory, which is flushed to
//! disk (fsync), renamed over the target (atomic on POSIX file systems), and
//! the directory is flushed so that the rename itself is on disk when the
//! call returns.
//!
//! [`append`] adds to a log: a kill in the middle leaves at most a partial
//! last line, which readers of such logs skip. [`sync_file`] and
//! [`sync_dir`] put appended data and new directory entries on disk before
//! something that refers to them (a checkpoint pointer) is written.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use tempfile::NamedTempFile;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// Replace `path` by `contents`, atomically and durably.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let contents = contents.as_ref();
    replace(path, |tmp| tmp.as_file_mut().write_all(contents))
}

/// Replace `path` by what `fill` writes to the path it is handed (a fresh
/// temporary file beside `path`), atomically and durably. For writers that
/// take a path rather than a handle, such as safetensors'
/// `serialize_to_file`; an error from `fill` leaves `path` as it was.
pub fn write_via_path(path: &Path, fill: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    replace(path, |tmp| fill(tmp.path()))
}

/// Append `bytes` to `path` (created if missing). Not synced: call
/// [`sync_file`] before writing anything that relies on it being on disk.
pub fn append(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    #[cfg(any(test, feature = "testing"))]
    if testing::crash_here() {
        // What a kill in the middle of the write leaves: part of the bytes.
        file.write_all(&bytes[..bytes.len() / 2])?;
        return Err(testing::crash_error());
    }
    file.write_all(bytes)
}

/// Flush `path`'s data and metadata to disk.
pub fn sync_file(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Flush `dir`'s entries (files created, renamed or removed in it) to disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    // Elsewhere a directory cannot be opened as a file; the rename is what
    // the platform offers.
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// The directory `path` lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Write a temporary file beside `path` with `fill`, sync it, rename it over
/// `path`, sync the directory. The temporary file is removed on any error
/// (a kill leaves it behind, named `.NAME.XXXXXX.tmp`, harmless).
fn replace(path: &Path, fill: impl FnOnce(&mut NamedTempFile) -> io::Result<()>) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let dir = parent_dir(path);
    let mut prefix = OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // tempfile's default is 0600; a file written in place would get 0666
    // less the umask, and so does its replacement.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir)?;
    fill(&mut tmp)?;
    #[cfg(any(test, feature = "testing"))]
    if testing::crash_here() {
        return testing::crash_leaving_half(tmp);
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn write_replaces_the_content_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write(&p, "old").unwrap();
        write(&p, "new content").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new content");
        assert_eq!(names(dir.path()), vec!["a.json"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_replaced_file_is_not_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        write(&p, "x").unwrap();
        fs::write(dir.path().join("b"), "x").unwrap();
        let mode = |n: &str| {
            fs::metadata(dir.path().join(n))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("a"), mode("b"), "same mode as a file written in place");
    }

    #[test]
    fn a_failing_writer_leaves_the_old_file_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.bin");
        write(&p, "old").unwrap();
        let e = write_via_path(&p, |tmp| {
            fs::write(tmp, "half of the n")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "disk on fire");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(names(dir.path()), vec!["w.bin"]);
        write_via_path(&p, |tmp| fs::write(tmp, "new")).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new");
    }

    #[test]
    fn a_crash_mid_write_leaves_the_old_content_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        write(&p, "old weights").unwrap();
        testing::crash_at(1);
        let e = write(&p, "new weights!").unwrap_err();
        assert!(testing::disarm(), "the crash happened");
        assert!(testing::is_simulated_crash(&e), "{e}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old weights");
        // The temporary file stays behind, as after a kill, half written.
        let left = names(dir.path());
        assert_eq!(left.len(), 2, "{left:?}");
        let tmp = left.iter().find(|n| n.ends_with(".tmp")).unwrap();
        assert!(tmp.starts_with(".model.safetensors."), "{tmp}");
        assert_eq!(fs::read_to_string(dir.path().join(tmp)).unwrap(), "new we");
    }

    #[test]
    fn a_crash_mid_append_leaves_a_partial_line_after_the_whole_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log.jsonl");
        append(&p, b"{\"a\":1}\n").unwrap();
        testing::crash_at(2);
        append(&p, b"{\"b\":2}\n").unwrap();
        assert!(append(&p, b"{\"c\":3}\n").is_err());
        assert!(testing::disarm());
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "{\"a\":1}\n{\"b\":2}\n{\"c\""
        );
        // Disarmed: nothing crashes any more.
        append(&p, b"\n").unwrap();
        assert!(!testing::disarm());
    }

    #[test]
    fn syncing_files_and_directories_works_and_names_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        append(&p, b"x").unwrap();
        sync_file(&p).unwrap();
        sync_dir(dir.path()).unwrap();
        assert_eq!(
            sync_file(&dir.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
