//! The result folder: written under a hidden `.partial` name and renamed into place only when
//! the run succeeded, so a folder that looks complete always is.
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where a run's files go.
#[derive(Debug)]
pub struct ResultDir {
    final_path: PathBuf,
    partial: PathBuf,
}

/// The default folder `experiments/<name>/<run-id>`, run-id a local timestamp
/// (`20250131-142502`, with `-2`, `-3`, … when taken).
pub fn default_result_path(name: &str) -> PathBuf {
    let base = Path::new("experiments").join(name);
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let mut path = base.join(&stamp);
    let mut n = 2;
    while path.exists() {
        path = base.join(format!("{stamp}-{n}"));
        n += 1;
    }
    path
}

impl ResultDir {
    /// Plans a result folder at `final_path`, refusing one that exists (results are never
    /// overwritten). Nothing is created yet.
    pub fn plan(final_path: PathBuf) -> Result<Self> {
        if final_path.exists() {
            return Err(Error::invalid(format!(
                "result folder {} already exists; choose another --out or remove it",
                final_path.display()
            )));
        }
        let leaf = final_path
            .file_name()
            .and_then(|s| s.to_str())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "--out {}: needs a folder name",
                    final_path.display()
                ))
            })?;
        let partial = final_path.with_file_name(format!(".{leaf}.partial-{}", std::process::id()));
        Ok(Self {
            final_path,
            partial,
        })
    }

    /// Creates the hidden partial folder (and `plots/` in it); returns its path.
    pub fn create(&self) -> Result<&Path> {
        let plots = self.partial.join("plots");
        std::fs::create_dir_all(&plots).map_err(|e| Error::io(&plots, e))?;
        Ok(&self.partial)
    }

    /// The folder files are written to until [`Self::finish`].
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// The folder the results will have.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// Renames the partial folder into place.
    pub fn finish(self) -> Result<PathBuf> {
        if self.final_path.exists() {
            return Err(Error::invalid(format!(
                "result folder {} appeared during the run; the results are in {}",
                self.final_path.display(),
                self.partial.display()
            )));
        }
        std::fs::rename(&self.partial, &self.final_path)
            .map_err(|e| Error::io(&self.final_path, e))?;
        Ok(self.final_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_folder_is_renamed_on_finish_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ResultDir::plan(tmp.path().join("run")).unwrap();
        let partial = dir.create().unwrap().to_path_buf();
        assert!(partial.join("plots").is_dir());
        assert!(!tmp.path().join("run").exists());
        let done = dir.finish().unwrap();
        assert!(done.join("plots").is_dir());
        assert!(!partial.exists());
        assert!(ResultDir::plan(done).is_err());
    }
}
