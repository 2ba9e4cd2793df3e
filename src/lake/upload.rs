//! Table files reach object storage in parts of at least [`MIN_PART_BYTES`].
//!
//! Iceberg's Parquet writer hands each finished row group to its `FileWrite` as one write (the
//! last one together with the footer). OpenDAL's S3 writer turns every write after the first
//! into one multipart-upload part. S3 and MinIO refuse a multipart upload whose parts before
//! the last are smaller than 5 MiB. Lake row groups are capped by their *estimated* encoded
//! size ([`super::commit::ROW_GROUP_BYTES`]), so nothing bounds a row group from below. This
//! wrapper around the OpenDAL storage therefore cuts the bytes into parts of a fixed size,
//! whatever the writes were. (SeaweedFS, our test server, accepts small parts, so only a strict
//! server would show the failure.)
//!
//! It is also what lets uploads overlap encoding. Lake files are written in row groups of
//! about [`super::commit::ROW_GROUP_BYTES`], each handed on once encoded. OpenDAL uploads one
//! part in the background while the next row group encodes, instead of the whole file being
//! uploaded after the last row is encoded.
//!
//! Invariant: every write to the inner writer but the last of a file is exactly
//! [`MIN_PART_BYTES`] long, one write at a time, in the order the bytes were written.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg_storage_opendal::OpenDalStorageFactory;
use serde::{Deserialize, Serialize};

/// Smallest part handed to the object store (S3's minimum is 5 MiB).
pub const MIN_PART_BYTES: usize = 8 << 20;

/// A storage factory whose writers hand the object store parts of at least
/// [`MIN_PART_BYTES`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartSizedStorageFactory {
    /// The storage underneath.
    pub inner: OpenDalStorageFactory,
}

#[typetag::serde(name = "LedgerlakePartSizedStorageFactory")]
impl StorageFactory for PartSizedStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(PartSizedStorage {
            inner: self.inner.build(config)?,
        }))
    }
}

/// See [`PartSizedStorageFactory`].
#[derive(Debug, Serialize, Deserialize)]
struct PartSizedStorage {
    inner: Arc<dyn Storage>,
}

#[async_trait]
#[typetag::serde(name = "LedgerlakePartSizedStorage")]
impl Storage for PartSizedStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        self.inner.read(path).await
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        self.inner.reader(path).await
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        self.inner.write(path, bs).await
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        Ok(Box::new(PartSizedWrite::new(
            self.inner.writer(path).await?,
        )))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        self.inner.delete_stream(paths).await
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        self.inner.new_input(path)
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        // The output file must write through this wrapper, not the inner storage.
        let me: Arc<dyn Storage> = Arc::new(PartSizedStorage {
            inner: self.inner.clone(),
        });
        Ok(OutputFile::new(me, path.to_string()))
    }
}

/// A part being handed to the inner writer; gives the writer back with the outcome.
type PartUpload = tokio::task::JoinHandle<(Box<dyn FileWrite>, iceberg::Result<()>)>;

/// Cuts the written bytes into parts of exactly [`MIN_PART_BYTES`] (the last one shorter) and
/// hands each to the inner writer in a task of its own, so the encoder goes on while the inner
/// writer waits for its previous part's upload (OpenDAL uploads one part at a time).
struct PartSizedWrite {
    /// Invariant: `None` exactly while `in_flight` holds it.
    inner: Option<Box<dyn FileWrite>>,
    /// The inner writer writing the previous part, and how that went.
    in_flight: Option<PartUpload>,
    /// Invariant: shorter than [`MIN_PART_BYTES`] between calls.
    pending: BytesMut,
}

impl PartSizedWrite {
    fn new(inner: Box<dyn FileWrite>) -> Self {
        Self {
            inner: Some(inner),
            in_flight: None,
            pending: BytesMut::new(),
        }
    }

    /// Waits for the part in flight; returns the inner writer.
    async fn settle(&mut self) -> iceberg::Result<&mut Box<dyn FileWrite>> {
        if let Some(task) = self.in_flight.take() {
            let (inner, result) = task.await.map_err(|e| {
                iceberg::Error::new(iceberg::ErrorKind::Unexpected, "uploading a part failed")
                    .with_source(e)
            })?;
            self.inner = Some(inner);
            result?;
        }
        self.inner.as_mut().ok_or_else(|| {
            iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "writer used after a failed upload",
            )
        })
    }

    async fn send(&mut self, part: Bytes) -> iceberg::Result<()> {
        self.settle().await?;
        let Some(mut inner) = self.inner.take() else {
            return Err(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                "writer used after a failed upload",
            ));
        };
        self.in_flight = Some(tokio::spawn(async move {
            let result = inner.write(part).await;
            (inner, result)
        }));
        Ok(())
    }
}

#[async_trait]
impl FileWrite for PartSizedWrite {
    async fn write(&mut self, mut bs: Bytes) -> iceberg::Result<()> {
        // Top up the pending part first; whole parts of `bs` then go on without a copy.
        if !self.pending.is_empty() {
            let take = (MIN_PART_BYTES - self.pending.len()).min(bs.len());
            self.pending.extend_from_slice(&bs.split_to(take));
            if self.pending.len() == MIN_PART_BYTES {
                let part = self.pending.split().freeze();
                self.send(part).await?;
            }
        }
        while bs.len() >= MIN_PART_BYTES {
            let part = bs.split_to(MIN_PART_BYTES);
            self.send(part).await?;
        }
        self.pending.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let last = self.pending.split().freeze();
        let inner = self.settle().await?;
        if !last.is_empty() {
            inner.write(last).await?;
        }
        inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records the size of every write it receives.
    struct Recorder(Arc<Mutex<Vec<usize>>>);

    #[async_trait]
    impl FileWrite for Recorder {
        async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
            self.0.lock().map_err(|_| poisoned())?.push(bs.len());
            Ok(())
        }
        async fn close(&mut self) -> iceberg::Result<()> {
            Ok(())
        }
    }

    fn poisoned() -> iceberg::Error {
        iceberg::Error::new(iceberg::ErrorKind::Unexpected, "poisoned")
    }

    async fn parts(writes: &[usize]) -> iceberg::Result<Vec<usize>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut w = PartSizedWrite::new(Box::new(Recorder(seen.clone())));
        for n in writes {
            w.write(Bytes::from(vec![7u8; *n])).await?;
        }
        w.close().await?;
        let out = seen.lock().map_err(|_| poisoned())?.clone();
        Ok(out)
    }

    #[tokio::test]
    async fn every_part_but_the_last_is_large_enough() -> iceberg::Result<()> {
        const M: usize = MIN_PART_BYTES;
        // A small row group then a footer: one part.
        assert_eq!(parts(&[3 << 20, 1000]).await?, vec![(3 << 20) + 1000]);
        // Large writes are cut into parts of exactly the minimum.
        assert_eq!(parts(&[M, M + 1, 10]).await?, vec![M, M, 11]);
        assert_eq!(parts(&[3 * M + 2]).await?, vec![M, M, M, 2]);
        // Small writes are gathered.
        let got = parts(&[M / 2, M / 2, M / 3, 5]).await?;
        assert_eq!(got, vec![M, M / 3 + 5]);
        assert!(got[..got.len() - 1].iter().all(|p| *p >= M));
        assert_eq!(got.iter().sum::<usize>(), M + M / 3 + 5);
        // Nothing written: nothing sent.
        assert!(parts(&[]).await?.is_empty());
        Ok(())
    }
}
