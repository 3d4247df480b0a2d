"""Dataset stages that read data: a random-access source or range, and streams of files (Parquet, TFRecord, tf.data)."""
