package seclake.localfs;

import org.apache.hadoop.fs.LocalFileSystem;

/** `fs.file.impl`: Hadoop's checksummed local file system over {@link NioRawLocalFileSystem}. */
public class NioLocalFileSystem extends LocalFileSystem {
    public NioLocalFileSystem() {
        super(new NioRawLocalFileSystem());
    }
}
