SELECT deadline FROM celery_deadlines_run WHERE id = %s AND reason = 'cancelled'
