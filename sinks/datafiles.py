"""Writing a sink's rows as Iceberg data files.

PyIceberg's own writer applies one set of Parquet options to every column.
The metadata columns are better served by their own: offsets ascend
(delta-encoded, no dictionary), record ids are random (neither a dictionary
nor compression can shrink them, so trying costs time for nothing). For an
unpartitioned table the sink therefore takes the same steps as PyIceberg's
`write_file` (project to the table schema with field ids, write, collect
statistics) with per-column options; for a partitioned table it uses
PyIceberg's writer as is.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Mapping
from functools import lru_cache

import pyarrow as pa
import pyarrow.parquet as pq
from isbre.catalog.pyiceberg_internals import as_file_schema, data_files_of, parquet_writer_options
from isbre.catalog.table_properties import location_provider
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import sanitize_column_names
from pyiceberg.table import Table, TableProperties
from pyiceberg.typedef import Record
from pyiceberg.utils.properties import property_as_int

# Per-column Parquet options: (dictionary, encoding or None, compression or None for the table's,
# statistics)
ColumnOptions = tuple[bool, str | None, str | None, bool]
PARQUET = FileFormatFactory.get(FileFormat.PARQUET)


@lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    # Parquet's leaf column paths (nested columns have several) for an Arrow schema, read back from
    # an empty file: pyarrow takes per-column options by these paths.
    sink = io.BytesIO()
    pq.write_table(schema.empty_table(), sink)
    parquet_schema = pq.ParquetFile(io.BytesIO(sink.getvalue())).schema
    return tuple(parquet_schema.column(i).path for i in range(len(parquet_schema)))


def write_data_files(table: Table, rows: pa.Table, options: Mapping[str, ColumnOptions]) -> list[DataFile]:
    metadata = table.metadata
    schema = metadata.schema()
    if not metadata.spec().is_unpartitioned() or sanitize_column_names(schema) != schema:
        return list(data_files_of(metadata, rows, table.io, uuid.uuid4()))
    file_schema = pyarrow_to_schema(
        rows.schema, name_mapping=schema.name_mapping, format_version=metadata.format_version
    )
    data = pa.Table.from_batches(
        [as_file_schema(schema, file_schema, batch, PARQUET) for batch in rows.to_batches()]
    )
    kwargs = parquet_writer_options(metadata.properties)
    codec, level = kwargs.pop("compression"), kwargs.pop("compression_level")
    paths = _leaf_paths(data.schema)
    dictionary = [p for p in paths if options.get(p, (True, None, None, True))[0]]
    statistics = [p for p in paths if options.get(p, (True, None, None, True))[3]]
    encodings = {p: o[1] for p, o in options.items() if o[1] is not None and p in paths}
    compression = {p: (options[p][2] if p in options and options[p][2] else codec) for p in paths}
    location = location_provider(metadata.location, metadata.properties).new_data_location(
        data_file_name=f"00000-0-{uuid.uuid4()}.parquet"
    )
    output = table.io.new_output(location)
    limit, default = TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
    row_group_rows = property_as_int(metadata.properties, limit, default)
    with output.create(overwrite=True) as stream:
        writer = pq.ParquetWriter(
            stream,
            data.schema,
            store_decimal_as_integer=True,
            use_dictionary=dictionary,
            column_encoding=encodings or None,
            compression=compression,
            compression_level=level,
            write_statistics=statistics,
            **kwargs,
        )
        with writer:
            writer.write(data, row_group_size=row_group_rows)
    collected = data_file_statistics_from_parquet_metadata(
        parquet_metadata=writer.writer.metadata,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return [
        DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=location,
            file_format=FileFormat.PARQUET,
            partition=Record(),
            file_size_in_bytes=len(output),
            sort_order_id=None,
            spec_id=metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **collected.to_serialized_dict(),
        )
    ]
